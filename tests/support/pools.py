"""A pool to run the live end-to-end tests on, either executor: `local` (one `gpupool serve`
with a fake fleet, jobs contained by its in-process agent) or `ray` (a plain
`ray start --head` on 127.0.0.1, two machines joined with `gpupool node join` on their own
loopback addresses and node directories, and `gpupool serve --ray`). Both run as root with
isolation on (team users, cgroups, a pids limit for batch jobs), the same teams, and
checkpoints in a shared storage directory.

The Ray pool must run in a loopback-only network namespace (tests/ray/conftest.py)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import containment
from gpupool.examples import ckpt_counter
from service_proc import Server, cli, free_port, wait_for

SYSTEM_PY = "/usr/bin/python3"
"""An interpreter a team's user can run (the test's own may live under /root)."""
FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}
"""The machines the Ray pool starts with."""
LATER = {"n3": "127.0.0.4"}
"""A machine a test joins while the pool runs."""
RACKS = {"n1": "r1", "n2": "r2", "n3": "r1"}
"""Each machine's rack (`gpupool node join --label rack=...`): n1 and n2 share none, so a
gang that requires a rack waits until n3 joins n1's."""
LATER_INLET = "0=45,1=45"
"""Its GPUs breathe 45 C air (`gpupool node join --fake-inlet`), the others 30 C."""
GPUS_PER_NODE = 2
STATE_DISK_MIB = 160
"""The server's state directory is a tmpfs of this size (root only)."""


def fill(disk: Path, size_mib: int) -> Path:
    """Write a file until `disk` (of `size_mib` MiB) has no space left; returns it (delete
    it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 65536
        for _ in range(size_mib * 16 + 16):  # bounded: more blocks than the disk holds
            os.write(fd, block)
    except OSError:
        pass
    finally:
        os.close(fd)
    shrink = 16
    while shrink:  # down to the last bytes: a write of a few KiB no longer fits
        try:
            with filler.open("ab") as f:
                f.write(b"\0" * (1024 * shrink))
        except OSError:
            shrink //= 2
    return filler


def _shift_hours(now: datetime.datetime) -> tuple[str, str]:
    """A time window from three hours before `now` to three after (UTC): open for a
    test's life, whatever the hour."""
    fmt = "%H:%M"
    span = datetime.timedelta(hours=3)
    return (now - span).strftime(fmt), (now + span).strftime(fmt)


def config_text(root: Path) -> str:
    start, end = _shift_hours(datetime.datetime.now(datetime.UTC))
    return (
        "teams:\n  - {name: ctest-a}\n  - {name: ctest-b}\n  - {name: web}\n"
        "  - {name: ctest-shift}\n"
        f'windows:\n  - {{from: "{start}", to: "{end}", teams: {{ctest-shift: {{max: 0.25}}}}}}\n'
        "preemption: {min_runtime_s: 0}\n"
        "autoscale: {restart_backoff_s: 2, restart_backoff_max_s: 8}\n"
        "energy: {power_capping: true}\n"
        "elastic: {grow_after_s: 3}\n"
        "topology: {levels: [rack]}\n"
        "isolation:\n  limits:\n    defaults: {batch: {pids: 48}}\n"
        f"storage: {{shared_dir: {root / 'shared'}}}\n"
    )


@dataclass
class Joined:
    """One `gpupool node join` process, the leader of its own process group."""

    name: str
    ip: str
    node_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Pool:
    kind: str
    """"local" or "ray"."""
    root: Path
    server: Server
    counter: Path
    """The checkpointing counter (gpupool.examples.ckpt_counter), where a team can run it."""
    head: str = ""
    nodes: dict[str, Joined] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def replica(self) -> Path:
        """A service replica a team can run (tests/support/plain_replica.py)."""
        return self.root / "plain_replica.py"

    @property
    def shared(self) -> Path:
        return self.root / "shared"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def log_copies(self, job_id: int, node: str) -> list[Path]:
        """Where a job's stdout is kept: the server's copy, and on Ray the node's own."""
        copies = [self.state / "jobs" / str(job_id) / "stdout.log"]
        if node in self.nodes:
            copies.append(self.nodes[node].node_dir / "runs" / str(job_id) / "stdout.log")
        return copies

    def join(self, name: str) -> Joined:
        """Start `gpupool node join` for `name` (again), in its own process group."""
        ip = {**NODES, **LATER}[name]
        node_dir = self.root / f"node-{name}"
        log = self.root / f"join-{name}.log"
        cmd = [sys.executable, "-m", "gpupool", "node", "join", self.head, "--name", name]
        cmd += ["--node-ip", ip, "--node-dir", str(node_dir)]
        cmd += ["--fake-gpus", f"{GPUS_PER_NODE}xA100-80GB", "--num-cpus", "1"]
        cmd += ["--drain-timeout", "60", "--label", f"rack={RACKS[name]}"]
        if name in LATER:  # the late machine stands in a hot aisle
            cmd += ["--fake-inlet", LATER_INLET]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        joined = Joined(name, ip, node_dir, proc, log)
        self.nodes[name] = joined
        return joined

    def node_states(self) -> dict[str, Any]:
        out = cli(self.url, "nodes", "--json")
        assert out.returncode == 0, out.stderr
        return {n["name"]: n for n in json.loads(out.stdout)["nodes"]}


def active_nodes(head: str) -> int:
    """How many nodes Ray counts active (`ray status`: no driver, no dashboard needed)."""
    ray = str(Path(sys.executable).with_name("ray"))
    out = subprocess.run(
        [ray, "status", "--address", head], capture_output=True, text=True, timeout=60, check=False
    )
    lines = [x.strip() for x in out.stdout.splitlines()]
    if "Active:" not in lines:
        return 0
    at, count = lines.index("Active:") + 1, 0
    while at < len(lines) and lines[at].split(" ", 1)[-1].startswith("node_"):
        count += int(lines[at].split()[0])
        at += 1
    return count


def _root() -> Path:
    containment.require()
    root = Path(tempfile.mkdtemp(prefix="gpupool-pool-", dir="/tmp"))
    root.chmod(0o711)  # the teams' users reach their job directories under it
    (root / "state").mkdir(mode=0o711)
    # the server's state on a disk of its own, small enough to fill (a full-disk test)
    opts = f"size={STATE_DISK_MIB}m,mode=0711"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(root / "state")], check=True)
    (root / "serve.yaml").write_text(config_text(root))
    for src in (Path(ckpt_counter.__file__), Path(__file__).with_name("plain_replica.py")):
        shutil.copy(src, root / src.name)
        (root / src.name).chmod(0o644)
    return root


def _clean(root: Path, pgids: list[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    for handle in (root / "state").glob("jobs/*/handle-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(int(json.loads(handle.read_text())["pgid"]), signal.SIGKILL)
    subprocess.run(["pkill", "-9", "-f", str(root)], check=False)
    subprocess.run(["umount", "-l", str(root / "state")], check=False)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def local_pool() -> Iterator[Pool]:
    """One `gpupool serve` with a fake fleet of 4 GPUs, isolation on."""
    root = _root()
    args = ("--fake-gpus", f"{2 * GPUS_PER_NODE}xA100-80GB", "--config", str(root / "serve.yaml"))
    args += ("--auth", "none", "--cycle", "0.2", "--sample", "0.5")
    server = Server(root / "state", *args, isolation=True)
    pool = Pool("local", root, server, root / "ckpt_counter.py")
    try:
        server.start(timeout_s=60)
        yield pool
    finally:
        server.stop()
        _clean(root, [])


@contextlib.contextmanager
def ray_pool() -> Iterator[Pool]:
    """A Ray head, two joined nodes of 2 GPUs each, and `gpupool serve --ray`."""
    root = _root()
    port = free_port()
    head = f"127.0.0.1:{port}"
    ray = str(Path(sys.executable).with_name("ray"))
    head_cmd = [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
    head_cmd += ["--port", str(port), "--num-cpus", "1", "--num-gpus", "0"]
    head_cmd += ["--include-dashboard", "false", "--disable-usage-stats"]
    head_cmd += ["--temp-dir", str(root / "head")]
    env = {**os.environ, **FAST_HEALTH, "RAY_USAGE_STATS_ENABLED": "0"}
    with (root / "head.log").open("ab") as out:
        head_proc = subprocess.Popen(
            head_cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(
        root / "state",
        "--config", str(root / "serve.yaml"), "--ray", head, "--ray-namespace", "gpupool-pool",
        "--auth", "none", "--cycle", "0.2", "--sample", "0.5",
        isolation=True,
    )  # fmt: skip
    pool = Pool("ray", root, server, root / "ckpt_counter.py", head=head)
    try:
        wait_for(lambda: active_nodes(head) >= 1, 90, "the Ray head")
        for name in NODES:
            pool.join(name)
        wait_for(lambda: active_nodes(head) >= 1 + len(NODES), 120, "the nodes")
        server.start(timeout_s=120)
        yield pool
    finally:
        server.stop()
        _clean(root, [n.proc.pid for n in pool.nodes.values()] + [head_proc.pid])
