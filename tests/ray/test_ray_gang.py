"""A training job wider than one node, through `gpupool serve --ray`, as a gang.

Its own Ray cluster: three gpupool nodes of 2 GPUs each, so the core places a 4-GPU job on
two of them and, once one is killed, can place it again on the two that are left. The job
is the socket all-reduce example (gpupool.examples.allreduce); each member says its rank,
world size and node; rank 1's node is killed; no process of the old gang survives; the job
resumes from rank 0's checkpoint with a new gang and ends with the exact result."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import Unavailable
from gpupool.examples.allreduce import expected_result
from gpupool.ports.executor.base import Exit, Gang, GangMember, Handle, LaunchSpec
from gpupool.server.agent.processes import read_start_ticks
from gpupool.server.executors.ray import RayExecutor
from gpupool.server.executors.ray_nodes import node_resources
from service_proc import HTTP, Server, cli, wait_for

PY = sys.executable
GANG_NODES = {"g1": ("A100-80GB", 2), "g2": ("A100-80GB", 2), "g3": ("A100-80GB", 2)}
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
MEMBER = re.compile(
    r"member rank=(\d+) world=(\d+) node=(\S+) local_world=(\S+) visible=(\S*) pid=(\d+)"
)


@pytest.fixture(scope="module")
def gang_cluster() -> Iterator[Any]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    import ray

    small = {"object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": FAST_HEALTH, **small},
    )
    nodes = {
        name: cluster.add_node(
            num_cpus=1, num_gpus=0, resources=node_resources(name, model, gpus), **small
        )
        for name, (model, gpus) in GANG_NODES.items()
    }
    ray.init(address=cluster.address, namespace="gpupool-gang-test", log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def server(gang_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cluster, _ = gang_cluster
    state = tmp_path_factory.mktemp("serve")
    teams = state / "teams.yaml"
    teams.write_text("teams:\n  - {name: ml}\npreemption: {min_runtime_s: 0}\n")
    srv = Server(
        state,
        "--config", str(teams), "--ray", cluster.address, "--ray-namespace", "gpupool-gang",
        "--auth", "none", "--cycle", "0.2", "--sample", "0.5",
    ).start(timeout_s=120)  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()
        for handle in state.glob("jobs/*/handle-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(handle.read_text())["pgid"]), signal.SIGKILL)


def show(url: str, job_id: int) -> dict[str, Any]:
    """What `gpupool show --json` prints (read over HTTP: polled many times)."""
    got = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10)
    assert got.status_code == 200, got.text
    job: dict[str, Any] = got.json()
    return job


def members(text: str) -> dict[int, tuple[int, str, str, str, int]]:
    """rank -> (world, node, local world, visible GPUs, pid) of the last attempt's lines."""
    found = {}
    for m in MEMBER.finditer(text):
        found[int(m[1])] = (int(m[2]), m[3], m[4], m[5], int(m[6]))
    return found


def alive(pid: int) -> bool:
    return read_start_ticks(pid) is not None


def kill_members(*run_dirs: Path) -> None:
    """SIGKILL the process group of every member whose log names its pid."""
    for run_dir in run_dirs:
        for log in run_dir.rglob("stdout.log"):
            for line in log.read_text().splitlines():
                if line.startswith("env ") and "pid=" in line:
                    with contextlib.suppress(OSError):
                        os.killpg(os.getpgid(int(line.rsplit("pid=", 1)[1])), signal.SIGKILL)


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


SLEEPER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(0)))\n"
    "keys = ('RANK', 'NODE_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR',"
    " 'MASTER_PORT', 'CUDA_VISIBLE_DEVICES', 'GPUPOOL_NODE')\n"
    "print('env', ' '.join(k + '=' + os.environ[k] for k in keys), 'pid=%d' % os.getpid(),"
    " flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


def gang_spec(job_id: str, run_dir: Path, *members: tuple[str, tuple[int, ...]]) -> LaunchSpec:
    gang = Gang(tuple(GangMember(n, g) for n, g in members), grace_s=5.0)
    gpus = tuple(i for _, g in members for i in g)
    return LaunchSpec(job_id, 1, (PY, "-c", SLEEPER), {}, gpus, run_dir, False, gang=gang)


def member_env(log: Path, timeout_s: float = 30.0) -> dict[str, str]:
    wait_for(lambda: log.is_file() and "env " in log.read_text(), timeout_s, f"{log}")
    line = next(x for x in log.read_text().splitlines() if x.startswith("env "))
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def wait_exit(ex: RayExecutor, job_id: str, timeout_s: float) -> Exit:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for e in ex.poll(time.time()):
            if e.job_id == job_id:
                return e
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not end within {timeout_s} s")


def test_a_members_crash_stops_the_whole_gang(gang_cluster: Any, tmp_path: Path) -> None:
    ex = RayExecutor(namespace="gang-crash")
    run_dir = tmp_path / "crash"
    h = ex.launch_many([(gang_spec("crash", run_dir, ("g1", (1,)), ("g2", (0, 1))), "g1")], 0)[0]
    assert isinstance(h, Handle)
    env0 = member_env(run_dir / "stdout.log")
    env1 = member_env(run_dir / "rank-1" / "stdout.log")
    assert (env0["RANK"], env0["NODE_RANK"], env0["WORLD_SIZE"]) == ("0", "0", "2")
    assert (env1["RANK"], env1["NODE_RANK"], env1["WORLD_SIZE"]) == ("1", "1", "2")
    assert (env0["LOCAL_WORLD_SIZE"], env1["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert (env0["CUDA_VISIBLE_DEVICES"], env1["CUDA_VISIBLE_DEVICES"]) == ("1", "0,1")
    assert (env0["GPUPOOL_NODE"], env1["GPUPOOL_NODE"]) == ("g1", "g2")
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == "127.0.0.1"
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] and int(env0["MASTER_PORT"]) > 0
    assert ex.poll(time.time()) == []
    pid0, pid1 = int(env0["pid"]), int(env1["pid"])
    os.kill(pid1, signal.SIGSEGV)  # rank 1 crashes: rank 0 is stopped, then the job ends
    ended = wait_exit(ex, "crash", 30)
    assert ended.outcome == "crashed", ended
    assert "gang member rank 1 on node g2: died of SIGSEGV" in ended.reason
    assert "other 1 members were stopped" in ended.reason
    assert not alive(pid0) and "term" in (run_dir / "stdout.log").read_text()
    assert ex.handles() == {}


def test_a_preempted_gang_gets_sigterm_then_sigkill_for_a_member_that_stays(
    gang_cluster: Any, tmp_path: Path
) -> None:
    ex = RayExecutor(namespace="gang-stubborn")
    run_dir = tmp_path / "stubborn"
    spec = gang_spec("stubborn", run_dir, ("g2", (0,)), ("g3", (1,)))
    ignore = "if os.environ['RANK'] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    stays = SLEEPER.replace("while True:", ignore + "while True:")
    spec = dataclasses.replace(spec, argv=(PY, "-c", stays))
    (h,) = ex.launch_many([(spec, "g2")], 0)
    assert isinstance(h, Handle)
    pid0 = int(member_env(run_dir / "stdout.log")["pid"])
    pid1 = int(member_env(run_dir / "rank-1" / "stdout.log")["pid"])
    ex.preempt("stubborn", 1.0, time.time())
    ended = wait_exit(ex, "stubborn", 30)
    assert ended.outcome == "killed", ended
    assert "SIGKILL after the 1 s grace" in ended.reason and "all 2 members" in ended.reason
    assert "term" in (run_dir / "stdout.log").read_text()  # rank 0 left on the SIGTERM
    assert not alive(pid0) and not alive(pid1)


def job_pids(job_id: str) -> list[int]:
    """Live processes of this machine whose environment says they belong to `job_id`."""
    needle = f"GPUPOOL_JOB_ID={job_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(int(name)):
            found.append(int(name))
    return found


def test_a_gang_starts_whole_or_not_at_all(gang_cluster: Any, tmp_path: Path) -> None:
    ex = RayExecutor(namespace="gang-none")
    for node in ("g1", "g3"):  # their launchers first: a new one takes seconds on a busy host
        ex.launcher_info(node)
    ex.START_TIMEOUT_S = 5.0
    # another job holds GPU 1 of g3, so rank 1 of the gang is refused while rank 0, on g1,
    # is started: the gang must not run on with rank 0 alone
    hold = (PY, "-c", "import time; time.sleep(120)")
    blocker = LaunchSpec("blocker", 1, hold, {}, (1,), tmp_path / "blocker", False)
    ex.launch_on(blocker, "g3", 0)
    run_dir = tmp_path / "none"
    spec = gang_spec("none", run_dir, ("g1", (0,)), ("g3", (1,)))
    (result,) = ex.launch_many([(spec, "g1")], 0)
    assert isinstance(result, Unavailable), result
    assert "not every member of its gang of 2 nodes (g1:0, g3:1) started" in str(result)
    assert "none runs, it is requeued" in str(result)
    assert "GPU 1 of node g3 is still held by job blocker" in str(result)
    assert "== attempt 1 ==" in (run_dir / "stdout.log").read_text()  # rank 0 had started
    wait_for(lambda: job_pids("none") == [], 10, "every started member to be killed")
    assert set(ex.handles()) == {"blocker"}
    ex.cancel("blocker", 0.0, time.time())
    assert wait_exit(ex, "blocker", 30).outcome == "cancelled"
    assert job_pids("blocker") == []


def test_after_a_restart_a_gang_is_adopted_whole_or_stopped(
    gang_cluster: Any, tmp_path: Path
) -> None:
    first = RayExecutor(namespace="gang-adopt")
    whole, half = tmp_path / "whole", tmp_path / "half"
    handles = first.launch_many(
        [
            (gang_spec("whole", whole, ("g1", (0,)), ("g2", (0,))), "g1"),
            (gang_spec("half", half, ("g1", (1,)), ("g3", (0,))), "g1"),
        ],
        0,
    )
    try:
        assert all(isinstance(h, Handle) for h in handles), handles
        pids = {
            name: [int(member_env(d / "stdout.log")["pid"]), int(member_env(d / sub)["pid"])]
            for name, d, sub in (
                ("whole", whole, "rank-1/stdout.log"),
                ("half", half, "rank-1/stdout.log"),
            )
        }
        first.shutdown()  # the scheduler restarts; the gangs run on
        victim = pids["half"][1]
        shim = parent_pid(victim)  # its node's launcher sees the member end when its shim does
        os.killpg(os.getpgid(victim), signal.SIGKILL)  # one member dies meanwhile
        wait_for(lambda: not alive(victim) and not alive(shim), 10, "rank 1 of half and its shim")
        again = RayExecutor(namespace="gang-adopt")
        h_whole, h_half = handles
        assert isinstance(h_whole, Handle) and isinstance(h_half, Handle)
        assert again.adopt(h_whole, whole) is True
        assert again.adopt(h_half, half) is False
        wait_for(lambda: not alive(pids["half"][0]), 10, "rank 0 of the half gang to be stopped")
        lost = [e for e in again.poll(time.time()) if e.job_id == "half"]
        assert lost and lost[0].outcome == "lost" and "never half a gang" in lost[0].reason
        assert all(alive(p) for p in pids["whole"])
        again.preempt("whole", 5.0, time.time())
        ended = wait_exit(again, "whole", 30)
        assert ended.outcome == "preempted", ended
        assert not any(alive(p) for p in pids["whole"])
    finally:  # nothing of it outlives the test, whatever failed
        kill_members(whole, half)


@pytest.mark.slow
def test_a_gang_job_survives_the_loss_of_a_members_node(server: Server, gang_cluster: Any) -> None:
    _, ray_nodes = gang_cluster
    url, steps = server.url, 200
    out = cli(
        url, "submit", "--team", "ml", "--kind", "training", "--gpus", "4", "--grace", "10s",
        "--checkpoint-every", "1s", "--json", "--",
        PY, "-m", "gpupool.examples.allreduce", "--steps", str(steps), "--step-s", "0.1",
        "--every", "5", "--timeout-s", "10",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = int(json.loads(out.stdout)["id"])
    run_dir = server.state_dir / "jobs" / str(job_id)
    wait_for(lambda: show(url, job_id)["state"] == "running", 60, "the gang to start")
    wait_for(lambda: "step=10 checkpoint" in cli(url, "logs", str(job_id)).stdout, 60, "steps")
    placed = show(url, job_id)["gpus"]
    nodes = sorted({g["node"] for g in placed})
    assert len(nodes) == 2 and len(placed) == 4
    rank1_log = run_dir / "rank-1" / "stdout.log"
    wait_for(lambda: 1 in members(rank1_log.read_text()), 30, "rank 1's first line")
    gang = members(cli(url, "logs", str(job_id)).stdout) | members(rank1_log.read_text())
    assert sorted(gang) == [0, 1]
    assert {gang[r][1] for r in gang} == set(nodes)
    for world, node, local_world, visible, _ in gang.values():
        assert world == 2 and local_world == "2"
        mine = sorted(g["index"] for g in placed if g["node"] == node)
        assert sorted(int(x) for x in visible.split(",")) == mine
    assert "rank 1" not in cli(url, "logs", str(job_id)).stdout  # rank 1 has its own log
    rank1_text = cli(url, "logs", str(job_id), "--rank", "1").stdout
    assert f"member rank=1 world=2 node={gang[1][1]}" in rank1_text

    victim = gang[1][1]
    old_pids = [gang[r][4] for r in gang]
    gang_cluster[0].remove_node(ray_nodes[victim], allow_graceful=False)

    wait_for(lambda: show(url, job_id)["attempts"] >= 2, 90, "the gang to be started again")
    wait_for(lambda: not any(alive(p) for p in old_pids), 30, "every old member to be gone")
    wait_for(lambda: show(url, job_id)["state"] == "succeeded", 180, "the job to finish")
    job = show(url, job_id)
    again = sorted({g["node"] for g in job["gpus"]})
    assert victim not in again and len(again) == 2 and len(job["gpus"]) == 4
    log = cli(url, "logs", str(job_id)).stdout
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) >= 10 and fields["world"] == "2"
    events = HTTP.get(f"{url}/v1/events", params={"after": 0, "job_id": job_id}).json()
    suspended = [e["message"] for e in events["events"] if e["kind"] == "suspended"]
    assert suspended and any(victim in m for m in suspended), suspended


@pytest.mark.slow
def test_a_restarted_server_adopts_a_whole_gang_and_requeues_a_broken_one(
    server: Server, gang_cluster: Any
) -> None:
    """Runs after the node kill above: two 2-GPU nodes are left, room for one gang."""
    url, steps = server.url, 250
    # 0.5 s a step on the first attempt (125 s: it outlives both restarts however slow the
    # host), 0.02 s once resumed
    pace = 'if [ -n "$GPUPOOL_RESUME" ]; then s=0.02; else s=0.5; fi; exec "$0" "$@" --step-s "$s"'
    out = cli(
        url, "submit", "--team", "ml", "--kind", "training", "--gpus", "4", "--grace", "10s",
        "--json", "--",
        "sh", "-c", pace, PY, "-m", "gpupool.examples.allreduce", "--steps", str(steps),
        "--every", "5", "--timeout-s", "10",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = int(json.loads(out.stdout)["id"])
    run_dir = server.state_dir / "jobs" / str(job_id)
    wait_for(lambda: "step=10 checkpoint" in cli(url, "logs", str(job_id)).stdout, 90, "steps")
    server.kill()  # a crash: the gang runs on without its scheduler
    server.start(timeout_s=120)
    events = HTTP.get(f"{url}/v1/events", params={"after": 0, "job_id": job_id}).json()
    assert any(e["kind"] == "adopted" for e in events["events"]), events
    assert show(url, job_id)["attempts"] == 1 and show(url, job_id)["state"] == "running"
    log = cli(url, "logs", str(job_id)).stdout
    done = max(int(n) for n in re.findall(r"^step=(\d+) checkpoint$", log, re.MULTILINE))
    more = f"step={done + 10} checkpoint"  # progress after the adoption
    wait_for(lambda: more in cli(url, "logs", str(job_id)).stdout, 60, "more")
    gang = members(log) | members((run_dir / "rank-1" / "stdout.log").read_text())
    server.kill()  # again, and this time rank 1 dies while nobody watches
    os.killpg(os.getpgid(gang[1][4]), signal.SIGKILL)
    server.start(timeout_s=120)
    wait_for(lambda: show(url, job_id)["attempts"] >= 2, 60, "the broken gang to be requeued")
    wait_for(lambda: not alive(gang[0][4]), 30, "rank 0 of the broken gang to be stopped")
    wait_for(lambda: show(url, job_id)["state"] == "succeeded", 120, "the job to finish")
    events = HTTP.get(f"{url}/v1/events", params={"after": 0, "job_id": job_id}).json()
    suspended = [e["message"] for e in events["events"] if e["kind"] == "suspended"]
    assert any("never half a gang" in m for m in suspended), suspended
    last = [x for x in cli(url, "logs", str(job_id)).stdout.splitlines() if "result=" in x][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert (
        int(fields["result"]) == expected_result(steps) and int(fields["resumed_from"]) >= done + 10
    )
