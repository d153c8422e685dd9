"""The cluster as a cluster: a plain `ray start --head` on 127.0.0.1, two machines joined
with `gpupool node join` on their own loopback addresses (127.0.0.2, 127.0.0.3) and node
directories, and `gpupool serve --ray` as root with isolation on. Jobs run contained on
the nodes (team users, cgroups, a pids limit, escaped children killed); a node whose
process group is SIGKILLed and whose node directory is deleted loses nothing that its
checkpointing job needs; a node stopped with SIGTERM drains its jobs to the other one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import containment
from gpupool.examples import ckpt_counter
from gpupool.examples.ckpt_counter import expected_result
from launch_kills import sigkills_around_launches
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


@dataclass
class Joined:
    """One `gpupool node join` process, the leader of its own process group."""

    name: str
    ip: str
    node_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class JoinedCluster:
    head: str
    root: Path
    nodes: dict[str, Joined]
    server: Server
    counter: Path

    def join(self, name: str) -> Joined:
        """Start `gpupool node join` for `name` (again), in its own process group."""
        ip = NODES[name]
        node_dir = self.root / f"node-{name}"
        log = self.root / f"join-{name}.log"
        cmd = [sys.executable, "-m", "gpupool", "node", "join", self.head, "--name", name]
        cmd += ["--node-ip", ip, "--node-dir", str(node_dir), "--fake-gpus", "2xA100-80GB"]
        cmd += ["--num-cpus", "1", "--drain-timeout", "60", "--label", "rack=r1"]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        joined = Joined(name, ip, node_dir, proc, log)
        self.nodes[name] = joined
        return joined


def _active_nodes(head: str) -> int:
    """How many nodes Ray counts active (`ray status`: no driver, no dashboard needed)."""
    ray = str(Path(sys.executable).with_name("ray"))
    out = subprocess.run(
        [ray, "status", "--address", head], capture_output=True, text=True, timeout=60, check=False
    )
    lines = out.stdout.splitlines()
    if "Active:" not in [x.strip() for x in lines]:
        return 0
    at = [x.strip() for x in lines].index("Active:") + 1
    count = 0
    while at < len(lines) and lines[at].strip().split(" ", 1)[-1].startswith("node_"):
        count += int(lines[at].split()[0])
        at += 1
    return count


@pytest.fixture(scope="module")
def joined() -> Iterator[JoinedCluster]:
    containment.require()
    root = Path(tempfile.mkdtemp(prefix="gpupool-join-", dir="/tmp"))
    root.chmod(0o711)  # the teams' users reach their job directories under it
    counter = root / "ckpt_counter.py"
    shutil.copy(ckpt_counter.__file__, counter)
    counter.chmod(0o644)
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
    teams = root / "serve.yaml"
    teams.write_text(
        "teams:\n  - {name: ctest-a}\n  - {name: ctest-b}\n"
        "preemption: {min_runtime_s: 0}\n"
        "isolation:\n  limits:\n    defaults: {batch: {pids: 48}}\n"
        f"storage: {{shared_dir: {root / 'shared'}}}\n"
    )
    cluster = JoinedCluster(head, root, {}, Server(root / "state", isolation=True), counter)
    try:
        wait_for(lambda: _active_nodes(head) >= 1, 90, "the Ray head")
        for name in NODES:
            cluster.join(name)
        wait_for(lambda: _active_nodes(head) >= 1 + len(NODES), 120, "the nodes")
        (root / "state").mkdir(mode=0o711)
        cluster.server = Server(
            root / "state",
            "--config", str(teams), "--ray", head, "--ray-namespace", "gpupool-join-test",
            "--auth", "none", "--cycle", "0.2", "--sample", "0.5",
            isolation=True,
        ).start(timeout_s=120)  # fmt: skip
        yield cluster
    finally:
        cluster.server.stop()
        for node in cluster.nodes.values():
            with contextlib.suppress(OSError):
                os.killpg(node.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(head_proc.pid, signal.SIGKILL)
        for handle in (root / "state").glob("jobs/*/handle-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(handle.read_text())["pgid"]), signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-f", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def submit(url: str, team: str, *args: str) -> int:
    out = cli(url, "submit", "--team", team, "--json", *args)
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["id"])


def show(url: str, job_id: int) -> dict[str, Any]:
    out = cli(url, "show", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    job: dict[str, Any] = json.loads(out.stdout)
    return job


def nodes_of(url: str, job_id: int) -> set[str]:
    return {g["node"] for g in show(url, job_id)["gpus"]}


def _nodes(url: str) -> dict[str, Any]:
    out = cli(url, "nodes", "--json")
    assert out.returncode == 0, out.stderr
    return {n["name"]: n for n in json.loads(out.stdout)["nodes"]}


def test_joined_machines_are_the_pool(joined: JoinedCluster) -> None:
    url = joined.server.url
    wait_for(
        lambda: all(n["agent"]["where"] != "no answer" for n in _nodes(url).values()),
        30,
        "every node's agent to answer",
    )
    nodes = _nodes(url)
    assert {k: (n["gpu_model"], len(n["gpus"]), n["state"]) for k, n in nodes.items()} == {
        "n1": ("A100-80GB", 2, "up"),
        "n2": ("A100-80GB", 2, "up"),
    }
    for name, n in nodes.items():  # each node's agent answers and reaches the storage
        assert n["agent"]["where"].startswith("launcher pid"), n["agent"]
        assert n["agent"]["storage"] == "ok" and not n["agent"]["leaving"]
        assert n["agent"]["dir"] == str(joined.nodes[name].node_dir / "agent")
    assert "launcher pid" in cli(joined.server.url, "nodes").stdout
    for node in joined.nodes.values():
        record = json.loads((node.node_dir / "node.json").read_text())
        assert record["node_ip"] == node.ip and record["labels"] == {"rack": "r1"}
        assert (node.node_dir / "ray").is_dir()  # Ray's own files stay in the node dir


CHECKPOINT_THEN_WAIT = """\
import os, subprocess, sys, time
open(os.path.join(os.environ['GPUPOOL_CHECKPOINT_DIR'], 'secret'), 'w').write('team a')
print('user', subprocess.run(['id', '-un'], capture_output=True, text=True).stdout.strip())
print('node', os.environ['GPUPOOL_NODE'], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""

HOSTILE = """\
import json, os, signal, subprocess, sys
a_ckpt, a_logs, a_pid = sys.argv[1], sys.argv[2:4], int(sys.argv[4])
tried = {}
try:
    open(os.path.join(a_ckpt, 'secret')).read(); tried['read checkpoint'] = 'allowed'
except OSError:
    tried['read checkpoint'] = 'denied'
for k, log in enumerate(a_logs):
    try:
        open(log).read(); tried[f'read log {k}'] = 'allowed'
    except OSError:
        tried[f'read log {k}'] = 'denied'
try:
    os.kill(a_pid, signal.SIGTERM); tried['signal'] = 'allowed'
except OSError:
    tried['signal'] = 'denied'
forked = 0
children = []
try:
    for _ in range(200):
        children.append(subprocess.Popen(['sleep', '30'])); forked += 1
except OSError:
    pass
for c in children:
    c.kill(); c.wait()
tried['forked'] = forked
# an escaped child: its own session, still running when the job ends
subprocess.Popen(['setsid', 'sleep', '300'], start_new_session=True)
print(json.dumps({'tried': tried, 'user': os.environ.get('USER')}), flush=True)
"""


def _process_running(argv: list[str]) -> bool:
    want = "\0".join(argv).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == want:
                return True
    return False


def test_jobs_run_contained_as_their_teams_on_the_joined_nodes(
    joined: JoinedCluster, tmp_path: Path
) -> None:
    url = joined.server.url
    release = joined.root / "release-a"
    a = submit(
        url, "ctest-a", "--kind", "training", "--gpus", "2", "--",
        SYSTEM_PY, "-c", CHECKPOINT_THEN_WAIT, str(release),
    )  # fmt: skip
    ckpt_a = joined.root / "shared" / "checkpoints" / str(a)
    wait_for(lambda: "node " in cli(url, "logs", str(a)).stdout, 90, "team a's job")
    log_a = cli(url, "logs", str(a)).stdout
    assert "user gpupool-ctest-a" in log_a
    (node_a,) = nodes_of(url, a)
    assert f"node {node_a}" in log_a
    secret = ckpt_a / "secret"  # in the shared storage, the team's alone
    assert secret.stat().st_uid == __import__("pwd").getpwnam("gpupool-ctest-a").pw_uid
    a_pid = next(
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and (Path(f"/proc/{p}/cmdline").read_bytes().find(str(release).encode()) >= 0)
        and Path(f"/proc/{p}/cmdline").read_bytes().startswith(SYSTEM_PY.encode())
    )
    b = submit(
        url, "ctest-b", "--kind", "batch", "--gpus", "1", "--",
        SYSTEM_PY, "-c", HOSTILE, str(ckpt_a),
        str(joined.root / "state" / "jobs" / str(a) / "stdout.log"),  # the server's copy
        str(joined.nodes[node_a].node_dir / "runs" / str(a) / "stdout.log"),  # the node's
        str(a_pid),
    )  # fmt: skip
    wait_for(lambda: show(url, b)["state"] in ("succeeded", "failed"), 90, "team b's job")
    assert show(url, b)["state"] == "succeeded", cli(url, "logs", str(b)).stdout
    seen = json.loads(cli(url, "logs", str(b)).stdout.strip().splitlines()[-1])
    assert seen["user"] == "gpupool-ctest-b"
    tried = seen["tried"]
    assert {k: v for k, v in tried.items() if k != "forked"} == {
        "read checkpoint": "denied",
        "read log 0": "denied",
        "read log 1": "denied",
        "signal": "denied",
    }
    assert 0 < tried["forked"] < 48  # the pids limit of batch jobs stopped the fork loop
    # the escaped `setsid sleep 300` was killed with its job, before the job was "ended"
    assert not _process_running(["sleep", "300"])
    assert show(url, a)["state"] == "running"
    release.touch()
    wait_for(lambda: show(url, a)["state"] == "succeeded", 60, "team a's job to finish")


def test_a_killed_node_loses_nothing_its_checkpointing_job_needs(joined: JoinedCluster) -> None:
    url = joined.server.url
    steps = 200
    pace = 'if [ -n "$GPUPOOL_RESUME" ]; then p=0.01; else p=0.3; fi'
    job = submit(
        url, "ctest-a", "--kind", "training", "--gpus", "2", "--checkpoint-every", "1s", "--",
        "sh", "-c",
        f'{pace}; exec {SYSTEM_PY} {joined.counter} --steps {steps} --step-s "$p" --every 5',
    )  # fmt: skip
    wait_for(lambda: "step=20" in cli(url, "logs", str(job)).stdout, 90, "progress")
    (victim,) = nodes_of(url, job)
    node = joined.nodes[victim]
    shared = joined.root / "shared" / "checkpoints" / str(job)
    assert (shared / "counter.json").is_file()  # the checkpoint is in the shared storage
    assert (node.node_dir / "runs" / str(job) / "stdout.log").is_file()  # the logs are not
    copy = joined.root / "state" / "jobs" / str(job) / "stdout.log"
    assert "step=20" in copy.read_text()  # `gpupool logs` read the server's copy
    os.killpg(node.proc.pid, signal.SIGKILL)  # the machine dies
    node.proc.wait(10)
    shutil.rmtree(node.node_dir)  # and its disk with it
    wait_for(lambda: show(url, job)["state"] == "succeeded", 180, "the job to finish elsewhere")
    done = show(url, job)
    assert done["attempts"] >= 2 and nodes_of(url, job) != {victim}
    log = cli(url, "logs", str(job)).stdout
    assert "== attempt 1 ==" in log and "step=20" in log  # the first attempt's output
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) > 0
    events = httpx.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    assert any(e["kind"] == "node-lost" and victim in e["message"] for e in events)
    # the machine comes back: it joins the pool again
    joined.join(victim)
    wait_for(
        lambda: any(
            n["name"] == victim and n["state"] == "up"
            for n in json.loads(cli(url, "nodes", "--json").stdout)["nodes"]
        ),
        120,
        f"node {victim} back in the pool",
    )


def test_a_node_stopped_with_sigterm_drains_its_job_to_the_other(joined: JoinedCluster) -> None:
    url = joined.server.url
    steps = 200
    pace = 'if [ -n "$GPUPOOL_RESUME" ]; then p=0.01; else p=0.3; fi'
    job = submit(
        url, "ctest-a", "--kind", "training", "--gpus", "2", "--grace", "20s", "--",
        "sh", "-c",
        f'{pace}; exec {SYSTEM_PY} {joined.counter} --steps {steps} --step-s "$p" --every 50',
    )  # fmt: skip
    wait_for(lambda: "step=10" in cli(url, "logs", str(job)).stdout, 90, "progress")
    (leaving,) = nodes_of(url, job)
    node = joined.nodes[leaving]
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(90) == 0, node.log.read_text()[-2000:]
    assert "left the cluster" in node.log.read_text()
    wait_for(lambda: show(url, job)["state"] == "succeeded", 120, "the job to finish elsewhere")
    assert nodes_of(url, job) != {leaving}
    log = cli(url, "logs", str(job)).stdout
    assert "SIGTERM: checkpoint saved" in log  # it left with its grace, not killed
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    assert int(dict(kv.split("=") for kv in last.split())["result"]) == expected_result(steps)
    events = httpx.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    assert any("is leaving" in e["message"] for e in events), events[-10:]


def test_join_refuses_a_second_agent_on_one_node_dir_and_bad_labels(
    joined: JoinedCluster,
) -> None:
    busy = next(n for n in joined.nodes.values() if n.proc.poll() is None)
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "node", "join", joined.head, "--name", "dup",
         "--node-dir", str(busy.node_dir), "--fake-gpus", "1xA100-80GB"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "another `gpupool node join`" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "node", "join", joined.head, "--label", "rack r1",
         "--fake-gpus", "1xA100-80GB", "--node-dir", str(joined.root / "x")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "KEY=VALUE" in out.stderr


def test_sigkills_in_launch_windows_on_ray_never_run_a_job_twice(joined: JoinedCluster) -> None:
    """20 SIGKILLs of a scheduler on the joined cluster, half of them aimed just after a
    launch intent appears (the server writes it before asking a node to start the
    attempt): a restarted scheduler finds the attempt by its token on whichever node
    started it, never starts a second copy (each job flocks a marker in shared storage)."""
    base = joined.root / "kills"
    (base / "state").mkdir(parents=True, mode=0o711)
    url = f"sqlite:///{base / 'state' / 'gpupool.db'}"
    seen = sigkills_around_launches(
        base, url, kills=20, seed=20261206, ray_address=joined.head,
        window_s=0.05, end_s=180.0, intent_wait_s=30.0,
    )  # fmt: skip
    print(seen)
    assert seen["kills"] == 20 and seen["jobs"] >= 20 and seen["starts"] >= seen["jobs"]
    assert seen["lost"] + seen["adopted_by_intent"] > 0  # some kills did land in a launch
