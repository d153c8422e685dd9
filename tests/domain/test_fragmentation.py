"""Fragmentation against hand-computed values (Weng et al., ATC '23, §3)."""

from __future__ import annotations

import math

import pytest

from gpupool.domain.fragmentation import FragmentationMeter, TaskShape, typical_tasks
from gpupool.domain.model import JobSpec


def job(i: int, cpu: int, count: int, milli: int = 1000, models: str = "") -> JobSpec:
    return JobSpec(
        job_id=f"j{i}",
        gpu_count=count,
        gpu_milli=milli,
        cpu_milli=cpu,
        gpu_models=frozenset(m for m in models.split("|") if m),
    )


def mix() -> list[JobSpec]:
    # 3 sharing tasks (500 milli, 1 CPU) and 1 whole-GPU task (2 CPUs): popularity 3/4, 1/4.
    return [job(0, 1000, 1, 500), job(1, 1000, 1, 500), job(2, 1000, 1, 500), job(3, 2000, 1)]


def test_typical_tasks_keep_the_popular_shapes_up_to_the_threshold() -> None:
    jobs = [job(i, 1000, 1, 100) for i in range(50)]
    jobs += [job(100 + i, 1000, 1, 200) for i in range(30)]
    jobs += [job(200 + i, 1000, 1, 300) for i in range(15)]
    jobs += [job(300 + i, 1000, 1, 400) for i in range(5)]
    tasks = typical_tasks(jobs, popularity=0.95)
    assert [t.shape.gpu_milli for t in tasks] == [100, 200, 300]
    assert [t.popularity for t in tasks] == pytest.approx([50 / 95, 30 / 95, 15 / 95])


def test_equal_counts_rank_the_larger_shape_first() -> None:
    tasks = typical_tasks([job(0, 1000, 1, 300), job(1, 2000, 1, 300)], popularity=1.0)
    assert tasks[0].shape == TaskShape(2000, 300, 1, "")


def test_node_fragmentation_by_hand() -> None:
    meter = FragmentationMeter(typical_tasks(mix()), ["X"])
    gpus = (1000, 300, 600)
    # sharing tasks fit; only the 300-milli GPU strands: 0.75 * 300.
    # whole-GPU tasks fit on GPU 0; the 300 and 600 strand: 0.25 * 900.
    assert meter.node("X", 10_000, gpus) == pytest.approx(225 + 225)
    # 1.5 CPUs left: whole-GPU tasks (2 CPUs) cannot run, every idle milli is fragment.
    assert meter.node("X", 1500, gpus) == pytest.approx(225 + 0.25 * 1900)
    # order of GPUs does not matter
    assert meter.node("X", 1500, (600, 1000, 300)) == meter.node("X", 1500, gpus)


def test_tasks_that_cannot_use_the_model_see_all_idle_gpu_as_fragment() -> None:
    jobs = [*mix()[:3], job(3, 2000, 1, models="Y")]
    meter = FragmentationMeter(typical_tasks(jobs), ["X", "Y"])
    assert meter.node("X", 10_000, (1000, 300, 600)) == pytest.approx(225 + 0.25 * 1900)
    assert meter.node("Y", 10_000, (1000, 300, 600)) == pytest.approx(225 + 225)


def test_cpu_only_tasks_count_every_idle_gpu() -> None:
    meter = FragmentationMeter(typical_tasks([job(0, 1000, 0), job(1, 1000, 1)]), ["X"])
    # half the mix wants no GPU: it sees all 1,300 idle milli; the whole-GPU half strands 300.
    assert meter.node("X", 10_000, (1000, 300)) == pytest.approx(0.5 * 1300 + 0.5 * 300)
    assert meter.node("X", 10_000, (0, 0)) == 0.0


def test_fully_used_node_has_no_fragment() -> None:
    meter = FragmentationMeter(typical_tasks(mix()), ["X"])
    assert meter.node("X", 0, (0, 0, 0, 0)) == 0.0
    assert not math.isnan(meter.node("X", 0, ()))
