"""RayExecutor on a real multi-node Ray cluster: placement, preemption, node death."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.errors import ConflictError
from gpupool.examples.ckpt_counter import expected_result
from gpupool.ports.executor.base import LaunchSpec
from gpupool.server.executors.ray import RayExecutor
from gpupool.server.executors.ray_nodes import ray_nodes

PY = sys.executable


def _spec(job_id: str, argv: list[str], run_dir: Path, gpus: tuple[int, ...], **kw: object):
    attempt = int(kw.pop("attempt", 1))  # type: ignore[call-overload]
    resume = bool(kw.pop("resume", False))
    return LaunchSpec(job_id, attempt, tuple(argv), {}, gpus, run_dir, resume)


def _wait(ex: RayExecutor, job_id: str, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for e in ex.poll(time.time()):
            if e.job_id == job_id:
                return e
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not end within {timeout_s} s")


def _counter(steps: int, step_s: float) -> list[str]:
    module = "gpupool.examples.ckpt_counter"
    return [PY, "-m", module, "--steps", str(steps), "--step-s", str(step_s), "--every", "5"]


def test_discovery_and_pinning(ray_cluster: Any, tmp_path: Path) -> None:
    found = {n.name: n for n in ray_nodes()}
    assert set(found) == set(ray_cluster.layout)
    for name, (model, gpus) in ray_cluster.layout.items():
        assert (found[name].model, found[name].gpu_count) == (model, gpus)
        assert found[name].ray_node_id == ray_cluster.ids[name]

    ex = RayExecutor()
    code = (
        "import os; print(os.environ['GPUPOOL_RAY_NODE_ID'], os.environ['GPUPOOL_NODE'], "
        "os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_JOB_ID'], "
        "os.environ['GPUPOOL_CHECKPOINT_DIR'], flush=True); import time; time.sleep(1.5)"
    )
    run_dir = tmp_path / "pin"
    h = ex.launch_on(_spec("pin", [PY, "-c", code], run_dir, (1, 3)), "a2", time.time())
    ray_cluster.pgids.append(h.pgid)
    assert ex.actor_node_id("pin") == ray_cluster.ids["a2"]
    # GPU indices 1 and 3 of a2 are claimed on the node: another job is refused them
    # while pin runs, and gets them once pin's end has been seen
    other = _spec("other", [PY, "-c", "pass"], tmp_path / "other", (3,))
    (refused,) = ex.launch_many([(other, "a2")], time.time())
    assert isinstance(refused, ConflictError) and "GPU 3 of node a2" in str(refused), refused
    e = _wait(ex, "pin", 30)
    assert e.outcome == "succeeded", e
    out = (run_dir / "stdout.log").read_text().split("\n")
    fields = next(line for line in out if line and not line.startswith("==")).split()
    assert fields[:4] == [ray_cluster.ids["a2"], "a2", "1,3", "pin"]
    assert fields[4] == str(run_dir.absolute() / "checkpoint")
    h2 = ex.launch_on(other, "a2", time.time())
    ray_cluster.pgids.append(h2.pgid)
    assert _wait(ex, "other", 30).outcome == "succeeded"


def test_a_launcher_that_dies_is_replaced_and_its_jobs_run_on(
    ray_cluster: Any, tmp_path: Path
) -> None:
    ex = RayExecutor(ray_cluster.ids)
    first = ex.launcher_info("a1")
    # the shims are fenced on the node's raylet, not on the launcher
    with open(f"/proc/{first['raylet'][0]}/cmdline", "rb") as f:
        assert b"raylet" in f.read()
    run_dir = tmp_path / "kept"
    steps = 400  # 20 s of work: it outlives the launcher's restart on a loaded host
    h = ex.launch_on(_spec("kept", _counter(steps, 0.05), run_dir, (2,)), "a1", time.time())
    ray_cluster.pgids.append(h.pgid)
    ck = run_dir / "checkpoint" / "counter.json"
    end = time.monotonic() + 30
    while not ck.exists():
        assert time.monotonic() < end, "no periodic checkpoint"
        time.sleep(0.1)
    os.kill(first["pid"], signal.SIGKILL)
    end = time.monotonic() + 60
    while True:  # Ray restarts it on the same node (max_restarts=-1)
        assert time.monotonic() < end, "the launcher was not replaced"
        assert ex.poll(time.time()) == []  # the job is never reported lost meanwhile
        try:
            now = ex.launcher_info("a1")
        except Exception:
            time.sleep(0.2)
            continue
        if now["pid"] != first["pid"]:
            break
        time.sleep(0.2)
    assert now["node_id"] == ray_cluster.ids["a1"]
    os.killpg(h.pgid, 0)  # the job's group still runs, with the same shim
    # the new launcher watches it and stops it: preempted, its checkpoint kept
    ex.preempt("kept", 10.0, time.time())
    e = _wait(ex, "kept", 30)
    assert e.outcome == "preempted", e
    # and starts work: the job resumes from its checkpoint and finishes
    h2 = ex.launch_on(
        _spec("kept", _counter(steps, 0.0), run_dir, (2,), attempt=2, resume=True),
        "a1",
        time.time(),
    )
    ray_cluster.pgids.append(h2.pgid)
    assert _wait(ex, "kept", 30).outcome == "succeeded"
    last = (run_dir / "stdout.log").read_text().strip().splitlines()[-1]
    result = dict(kv.split("=") for kv in last.split())
    assert int(result["result"]) == expected_result(steps)
    assert int(result["resumed_from"]) > 0


def test_preempt_and_resume_on_another_node(ray_cluster: Any, tmp_path: Path) -> None:
    ex = RayExecutor(ray_cluster.ids)
    run_dir = tmp_path / "ck"
    steps = 60
    argv = _counter(steps, 0.05)
    h = ex.launch_on(_spec("ck", argv, run_dir, (0,)), "a1", time.time())
    ray_cluster.pgids.append(h.pgid)
    ck = run_dir / "checkpoint" / "counter.json"
    end = time.monotonic() + 30
    while not ck.exists():
        assert time.monotonic() < end, "no periodic checkpoint"
        time.sleep(0.1)
    ex.preempt("ck", 10.0, time.time())
    e = _wait(ex, "ck", 20)
    assert e.outcome == "preempted", e
    h2 = ex.launch_on(_spec("ck", argv, run_dir, (2,), attempt=2, resume=True), "h1", time.time())
    ray_cluster.pgids.append(h2.pgid)
    assert ex.actor_node_id("ck") == ray_cluster.ids["h1"]
    e2 = _wait(ex, "ck", 30)
    assert e2.outcome == "succeeded", e2
    last = (run_dir / "stdout.log").read_text().strip().splitlines()[-1]
    result = dict(kv.split("=") for kv in last.split())
    assert int(result["result"]) == expected_result(steps)
    assert int(result["resumed_from"]) > 0


def test_node_death_is_lost_and_job_resumes_elsewhere(ray_cluster: Any, tmp_path: Path) -> None:
    ex = RayExecutor(ray_cluster.ids)
    run_dir = tmp_path / "dn"
    steps = 400
    argv = _counter(steps, 0.05)
    h = ex.launch_on(_spec("dn", argv, run_dir, (0, 1)), "h1", time.time())
    ray_cluster.pgids.append(h.pgid)
    ck = run_dir / "checkpoint" / "counter.json"
    end = time.monotonic() + 30
    while not ck.exists():
        assert time.monotonic() < end, "no periodic checkpoint"
        time.sleep(0.1)
    assert ex.poll(time.time()) == []
    ray_cluster.cluster.remove_node(ray_cluster.nodes["h1"], allow_graceful=False)
    killed_at = time.monotonic()
    e = _wait(ex, "dn", 30)
    assert e.outcome == "lost", e
    detected_s = time.monotonic() - killed_at
    # On a real node the job's processes die with the machine; here the "node" was only a
    # raylet on this machine, so the orphaned job is stopped by hand before resuming.
    with contextlib.suppress(OSError):
        os.killpg(h.pgid, signal.SIGKILL)
    # The actor usually dies first (its worker exits with the raylet); the GCS health
    # check (1 s period, 3 misses, see conftest) then drops the node from the pool.
    while "h1" in {n.name for n in ray_nodes()}:
        assert time.monotonic() - killed_at < 20, "the dead node is still listed alive"
        time.sleep(0.2)
    h2 = ex.launch_on(
        _spec("dn", _counter(steps, 0.0), run_dir, (0, 1), attempt=2, resume=True),
        "a1",
        time.time(),
    )
    ray_cluster.pgids.append(h2.pgid)
    e2 = _wait(ex, "dn", 30)
    assert e2.outcome == "succeeded", e2
    last = (run_dir / "stdout.log").read_text().strip().splitlines()[-1]
    result = dict(kv.split("=") for kv in last.split())
    assert int(result["result"]) == expected_result(steps)
    assert int(result["resumed_from"]) > 0
    assert detected_s < 30
