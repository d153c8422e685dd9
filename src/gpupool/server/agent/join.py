"""`gpupool node join`: make this machine a node of a gpupool Ray cluster.

It starts a Ray worker node (`ray start --block`) that declares gpupool's resources for
this machine's GPUs (found through NVML, or declared fake), with its own node directory
(`GPUPOOL_NODE_DIR` in the environment of every Ray process of the node, so each node's
launcher, the agent, keeps its records there), and stays in the foreground until stopped,
like `slurmd`. The Ray processes it starts stay in its process group: SIGKILL to that group
is the machine's death (the shims' fences then kill its jobs). SIGTERM or SIGINT drains
it: the node says it is leaving (a `leaving` file the agent reports to the server, which
preempts its jobs with their grace and requeues them from their checkpoint elsewhere),
waits until none of its jobs runs (at most `drain_timeout_s`) and the server has collected
their last output (at most `HANDOVER_S` more), then stops Ray and exits 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError
from gpupool.ports.telemetry.fake import parse_inlet
from gpupool.server.agent.processes import alive
from gpupool.server.executors.files import read_json
from gpupool.server.executors.ray_launcher import LEAVING_FILE, NODE_DIR_ENV
from gpupool.server.executors.ray_nodes import label_resource, node_resources
from gpupool.server.fleet.labels import check_label
from gpupool.server.telemetry.ray import FAKE_INLET_ENV

RAY_DRAIN_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
START_TRIES = 4
"""How many times `ray start` is tried when it fails while starting (see START_WINDOW_S)."""
START_WINDOW_S = 120.0
"""A `ray start --block` that exits within this long of being started failed to start (on
a busy machine Ray's raylet gives up when its agents are slow to come up): it is tried
again after a backoff. One that ran longer had joined: its end is the node's end."""
START_BACKOFF_S = 2.0
"""The wait before the second try; it doubles for each further one."""
HANDOVER_S = 15.0
"""How long a drained node waits, once its jobs have ended, for the server to collect their
last output (it polls every cycle: a second or two); a server that is down does not keep
the machine longer than this."""


@dataclass(frozen=True)
class JoinOptions:
    """What `gpupool node join` was given (see its --help)."""

    head: str
    name: str
    node_dir: Path
    fake_gpus: str | None = None
    fake_inlet: str | None = None
    """With fake GPUs: the inlet air of some of them (`0=45,1=45`), as `gpupool serve
    --fake-inlet` gives it, read by the node's telemetry (a hot aisle to rehearse)."""
    node_ip: str | None = None
    site: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    num_cpus: int | None = None
    drain_timeout_s: float = 300.0
    ray: str = ""
    """The `ray` command; default: the one beside this Python."""


def inventory(fake_gpus: str | None) -> tuple[str, int]:
    """This machine's GPU model and count: declared fake, else found through NVML."""
    if fake_gpus:
        from gpupool.ports.telemetry.fake import fake_nodes, parse_fleet

        if fake_nodes(fake_gpus):
            raise SpecError(
                f"--fake-gpus {fake_gpus!r}: a joining node declares its own GPUs "
                "(4xA100-80GB); give its place in the network with --label rack=r1"
            )
        gpus = parse_fleet(fake_gpus)
    else:
        from gpupool.server.telemetry.nvml import NoGpuError, NvmlTelemetry

        try:
            tele = NvmlTelemetry()
        except NoGpuError as err:
            raise SpecError(
                f"{err}; to try gpupool without GPUs, declare fake ones: --fake-gpus 4xA100-80GB"
            ) from None
        try:
            gpus = tele.inventory()
        finally:
            tele.close()
    models = sorted({g.model for g in gpus})
    if len(models) != 1:
        raise SpecError(
            f"this machine has GPUs of {len(models)} models ({', '.join(models)}); a gpupool "
            "node holds one model: run one node per model with --fake-gpus, or remove the odd "
            "cards"
        )
    return models[0], len(gpus)


def resources(opts: JoinOptions, model: str, count: int) -> dict[str, float]:
    """The Ray resources the node declares: gpupool's node, model, site and GPU indices,
    and one per label (`gpupool_label_<key>_<value>`)."""
    res = node_resources(opts.name, model, count, opts.site)
    for key, value in sorted(opts.labels.items()):
        res[label_resource(key, value)] = 1.0
    return res


def ray_command(opts: JoinOptions, res: Mapping[str, float]) -> list[str]:
    """`ray start --block` for this node: its own address and Ray directory (in the node
    directory), no GPUs of Ray's own (gpupool places them)."""
    ray = opts.ray or str(Path(sys.executable).with_name("ray"))
    argv = [ray, "start", "--block", "--address", opts.head, "--num-gpus", "0"]
    argv += ["--resources", json.dumps(dict(res)), "--disable-usage-stats"]
    argv += ["--temp-dir", str(ray_dir(opts.node_dir))]
    if opts.node_ip:
        argv += ["--node-ip-address", opts.node_ip]
    if opts.num_cpus is not None:
        argv += ["--num-cpus", str(opts.num_cpus)]
    return argv


SOCKET_PATH_MAX = 107
"""The longest path of a Unix socket (sun_path less its terminating NUL)."""
RAY_SOCKET_SUFFIX = len("/session_2026-12-06_19-30-23_659825_4194303/sockets/plasma_store")
"""What Ray adds below its directory for the deepest of its sockets."""


def ray_dir(node_dir: Path) -> Path:
    """Ray's directory for the node: `ray` in the node directory, or, where that path is
    too long for Ray's Unix sockets below it, a short one in the system's temporary
    directory named after the node directory (`ray` in the node directory then links to
    it, so the node's files are still found there)."""
    inside = node_dir.absolute() / "ray"
    if len(str(inside)) + RAY_SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return inside
    digest = hashlib.sha1(str(node_dir.absolute()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gpupool-ray-{digest}"


def link_ray_dir(node_dir: Path) -> None:
    """Make the node's Ray directory; a short one outside is linked from the node
    directory."""
    target = ray_dir(node_dir)
    target.mkdir(parents=True, exist_ok=True)
    inside = node_dir.absolute() / "ray"
    inside.parent.mkdir(parents=True, exist_ok=True)
    if target != inside and not inside.is_symlink():
        if inside.exists():
            shutil.rmtree(inside, ignore_errors=True)
        inside.symlink_to(target, target_is_directory=True)


def _records(node_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The agent's records on this node: (job or gang member, record)."""
    out = []
    for path in sorted((node_dir / "agent").glob("job-*.json")):
        entry = read_json(path)
        if entry:
            out.append((str(entry.get("job_id", path.stem[4:])), entry))
    return out


def unreleased_jobs(node_dir: Path) -> list[str]:
    """The jobs (and gang members) whose attempts the server has not yet seen end: their
    records stay until it has copied their last output and released their GPUs."""
    return [job for job, _ in _records(node_dir)]


def running_jobs(node_dir: Path) -> list[str]:
    """The jobs (and gang members) whose shims still run on this node, from its agent's
    records."""
    return [
        job
        for job, entry in _records(node_dir)
        if alive(int(entry.get("pid", 0)), int(entry.get("ticks", -1)))
    ]


class NodeJoin:
    """One joined node: `run()` blocks until the node has left (drained or its Ray gone)."""

    def __init__(
        self, opts: JoinOptions, say: Callable[[str], None] = lambda line: print(line, flush=True)
    ) -> None:
        self.opts = opts
        self.say = say
        self.leave = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        opts = self.opts
        if opts.fake_inlet and not opts.fake_gpus:
            raise SpecError("--fake-inlet is for fake GPUs: add --fake-gpus")
        model, count = inventory(opts.fake_gpus)
        if opts.fake_inlet:
            bad = sorted(set(parse_inlet(opts.fake_inlet)) - set(range(count)))
            if bad:
                raise SpecError(
                    f"--fake-inlet names GPU {bad[0]}, but this node has GPUs 0-{count - 1}"
                )
        node_dir = opts.node_dir.absolute()
        (node_dir / "agent").mkdir(parents=True, exist_ok=True)
        lock = open(node_dir / ".join.lock", "a+b")  # noqa: SIM115 - held while we run
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecError(
                f"another `gpupool node join` runs with node directory {node_dir}: stop it, "
                "or give this one its own --node-dir"
            ) from None
        (node_dir / "agent" / LEAVING_FILE).unlink(missing_ok=True)
        link_ray_dir(node_dir)
        res = resources(opts, model, count)
        record = {
            "name": opts.name,
            "model": model,
            "gpus": count,
            "site": opts.site,
            "labels": dict(opts.labels),
            "head": opts.head,
            "node_ip": opts.node_ip or "",
            "fake_inlet": opts.fake_inlet or "",
            "pid": os.getpid(),
            "started_at": time.time(),
        }
        (node_dir / "node.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        env = {**os.environ, NODE_DIR_ENV: str(node_dir), "RAY_USAGE_STATS_ENABLED": "0"}
        if opts.fake_inlet:
            env[FAKE_INLET_ENV] = opts.fake_inlet
        # gpupool has moved the node's jobs by the time it stops Ray: Ray's own drain on
        # SIGTERM (30 s, for Ray Serve's replicas) would only delay the node's exit
        env.setdefault(RAY_DRAIN_ENV, "0")
        argv = ray_command(opts, res)
        if shutil.which(argv[0]) is None:
            raise SpecError(
                f"cannot find Ray's `ray` command at {argv[0]}: pip install 'gpupool[ray]'"
            )
        self.say(
            f"gpupool node {opts.name}: {count}x{model} joining {opts.head}"
            f"{' as ' + opts.node_ip if opts.node_ip else ''}; node directory {node_dir}"
        )
        try:
            return self._run_ray(argv, env, node_dir)
        finally:
            lock.close()

    def _run_ray(self, argv: list[str], env: Mapping[str, str], node_dir: Path) -> int:
        """Start Ray, again with a backoff while it fails to start, and stay until the node
        leaves."""
        for attempt in range(1, START_TRIES + 1):
            # The same process group as ours: a SIGKILL to it is the machine's death.
            self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
            started = time.monotonic()
            rc = self._wait(node_dir)
            if rc is None:
                return 0
            failed_start = time.monotonic() - started < START_WINDOW_S
            if not failed_start or attempt == START_TRIES:
                why = "did not start" if failed_start else "stopped"
                tries = f" ({attempt} tries)" if failed_start else ""
                self.say(f"gpupool node {self.opts.name}: Ray {why} (exit {rc}){tries}; leaving")
                return rc or 1
            backoff_s = START_BACKOFF_S * 2.0 ** (attempt - 1)
            self.say(
                f"gpupool node {self.opts.name}: Ray did not start (exit {rc}); trying again "
                f"in {backoff_s:g} s (try {attempt + 1} of {START_TRIES})"
            )
            if self.leave.wait(backoff_s):
                return 0
        return 1  # not reached: the last try returns above

    def _wait(self, node_dir: Path) -> int | None:
        """Until Ray exits (its exit status) or the node is asked to leave (drained and
        stopped: None)."""
        proc = self._proc
        assert proc is not None
        while not self.leave.wait(0.5):
            rc = proc.poll()
            if rc is not None:
                return rc
        # Draining: the agent tells the server, which moves the jobs with their grace.
        (node_dir / "agent" / LEAVING_FILE).write_text(str(time.time()), encoding="utf-8")
        deadline = time.monotonic() + self.opts.drain_timeout_s
        last: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            jobs = running_jobs(node_dir)
            if not jobs:
                break
            if jobs != last:
                self.say(f"gpupool node {self.opts.name}: draining, waiting for {', '.join(jobs)}")
                last = jobs
            time.sleep(0.5)
        left = running_jobs(node_dir)
        if left:
            self.say(
                f"gpupool node {self.opts.name}: {len(left)} job(s) still ran after "
                f"{self.opts.drain_timeout_s:.0f} s ({', '.join(left)}); they die with the node"
            )
        # The server's last look: it copies each ended attempt's output from this node and
        # then releases it (its record goes). Leaving first would take that output along.
        handover = time.monotonic() + HANDOVER_S
        while time.monotonic() < handover and proc.poll() is None and unreleased_jobs(node_dir):
            time.sleep(0.2)
        self.stop_ray()
        self.say(f"gpupool node {self.opts.name}: left the cluster")
        return None

    def stop_ray(self) -> None:
        """Stop the node's Ray processes (ray start --block stops its children on SIGTERM)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def default_name() -> str:
    """This machine's short host name, as a node name."""
    return socket.gethostname().split(".")[0] or "node"


def run_join(opts: JoinOptions) -> int:
    """Join, drain on SIGTERM or SIGINT, and return the exit status."""
    joined = NodeJoin(opts)

    def leave(signum: int, _frame: Any) -> None:
        joined.say(f"gpupool node {opts.name}: {signal.Signals(signum).name}: draining")
        joined.leave.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    with contextlib.suppress(KeyboardInterrupt):
        return joined.run()
    return 1


def parse_labels(values: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE words into a mapping (they become Ray resource names): a key of letters,
    digits and '-', a value of letters, digits, '-' and '_'."""
    out: dict[str, str] = {}
    for word in values:
        key, _, value = word.partition("=")
        try:
            check_label(key, value, f"label {word!r}")
        except SpecError:
            raise SpecError(
                f"label {word!r}: write KEY=VALUE, a key of letters, digits and - and a "
                "value of letters, digits, - and _ (e.g. rack=r7)"
            ) from None
        out[key] = value
    return out
