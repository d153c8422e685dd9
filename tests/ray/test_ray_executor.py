"""RayExecutor on a real multi-node Ray cluster: placement, preemption, node death."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.examples.ckpt_counter import expected_result
from gpupool.service.executor import LaunchSpec
from gpupool.service.ray_executor import RayExecutor, gpu_resource, ray_nodes

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
    # GPU indices 1 and 3 of a2 are held: the Ray resource view shows them taken.
    import ray

    avail = ray.available_resources()
    assert avail.get(gpu_resource("a2", 1), 0) == 0 and avail.get(gpu_resource("a2", 3), 0) == 0
    assert avail.get(gpu_resource("a2", 0)) == 1
    e = _wait(ex, "pin", 30)
    assert e.outcome == "succeeded", e
    out = (run_dir / "stdout.log").read_text().split("\n")
    fields = next(line for line in out if line and not line.startswith("==")).split()
    assert fields[:4] == [ray_cluster.ids["a2"], "a2", "1,3", "pin"]
    assert fields[4] == str(run_dir.absolute() / "checkpoint")
    # The actor is gone once the exit was reported: its GPU resources are free again.
    end = time.monotonic() + 5
    while ray.available_resources().get(gpu_resource("a2", 1), 0) != 1:
        assert time.monotonic() < end, "GPU resources not freed"
        time.sleep(0.1)


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
