"""A failed GPU in the core: only that card is out; its job is returned to be stopped, the
node's other cards take work, nothing new goes to the failed one, and it comes back."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.domain.model import JobSpec
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import GpuDown, GpuUp, Launch, Scheduler, SchedulerConfig
from gpupool.server.loop.config import build_cluster


def _launched(commands: Sequence[object]) -> dict[str, tuple[int, ...]]:
    return {c.job_id: c.placement.shares[0].gpus for c in commands if isinstance(c, Launch)}


def test_a_failed_gpu_is_out_alone_and_comes_back() -> None:
    cluster, _ = build_cluster(FakeTelemetry("2xA100-80GB").inventory(), "h")
    node = cluster.nodes[0].name
    core = Scheduler(cluster, SchedulerConfig(cycle_s=1.0))
    core.submit(JobSpec("a", gpu_count=1, submit_s=0.0), 0.0)
    started = _launched(core.cycle(0.0))
    assert set(started) == {"a"}
    gpu = started["a"][0]
    assert core.gpu_down(node, gpu, 1.0, "XID 79") == ["a"]  # the driver stops it
    assert core.state.gpu_rows[0][gpu] == 0  # reads as full: nothing new goes there
    core.lost("a", 2.0, "GPU failed")
    assert core.state.free_rows[0][gpu] == 1000  # released; still out
    assert _launched(core.cycle(2.0)) == {"a": (1 - gpu,)}  # resumes on the other card
    core.submit(JobSpec("b", gpu_count=1, submit_s=3.0), 3.0)
    assert _launched(core.cycle(3.0)) == {}
    core.observe(GpuUp(4.0, node, gpu))
    assert _launched(core.cycle(4.0)) == {"b": (gpu,)}
    core.observe(GpuDown(5.0, node, gpu, "ECC"))  # as an event, the same call
    assert core.fleet.gpu_down_why == {(0, gpu): "ECC"}
    noted = [(d.action, d.job_id) for d in core.log.decisions if d.job_id.startswith("gpu:")]
    card = f"gpu:{node}/{gpu}"
    assert noted == [("gpu-lost", card), ("gpu-restored", card), ("gpu-lost", card)]
