"""Determinism: one trace and seed give a byte-identical decision log, pinned by a golden file.

Regenerate a golden file only on purpose: GPUPOOL_REGOLD=1 pytest tests/parity/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gpupool.domain.model import Cluster, JobSpec
from gpupool.sim.replay.experiments import DEFAULT_NODES, DEFAULT_PODS, embedded
from gpupool.sim.replay.fill import run_fill
from gpupool.sim.replay.run import run_replay
from gpupool.traces.openb import read_nodes, read_pods

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def small_fill_inputs() -> tuple[Cluster, list[JobSpec]]:
    cluster, _ = read_nodes(embedded(DEFAULT_NODES))
    # every 15th node keeps all GPU models; the first 600 pods keep the task mix
    cluster = Cluster(cluster.name, cluster.nodes[::15])
    pods, _ = read_pods(embedded(DEFAULT_PODS))
    return cluster, pods[:600]


def fill_log(policy: str, seed: int) -> str:
    cluster, pods = small_fill_inputs()
    result = run_fill(cluster, pods, policy, seed, tune=1.3)
    return result.log.render(result.node_names)


def synthetic_trace(seed: int, n: int = 400) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    submit = np.cumsum(rng.exponential(300.0, n)).round()
    return [
        JobSpec(
            f"job{i:04d}",
            gpu_count=int(rng.choice([1, 1, 1, 2, 4, 8, 16])),
            submit_s=float(submit[i]),
            duration_s=float(max(1, round(rng.lognormal(7.5, 1.2)))),
        )
        for i in range(n)
    ]


def replay_log(queue: str, seed: int) -> str:
    result = run_replay(synthetic_trace(seed), nodes=4, gpus_per_node=8, queue=queue)
    return result.log.render(result.node_names)


CASES = {
    "fill_fgd_seed7.log": lambda: fill_log("fgd", 7),
    "fill_random_seed7.log": lambda: fill_log("random", 7),
    "replay_fifo_seed3.log": lambda: replay_log("fifo", 3),
    "replay_srtf_seed3.log": lambda: replay_log("srtf", 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decision_log_matches_golden(name: str) -> None:
    log = CASES[name]()
    path = GOLDEN / name
    if os.environ.get("GPUPOOL_REGOLD"):
        path.write_text(log, encoding="utf-8")
    assert path.exists(), f"{path} missing; create it with GPUPOOL_REGOLD=1"
    assert log == path.read_text(encoding="utf-8"), f"decision log differs from {path}"


def test_same_seed_same_bytes_other_seed_other_decisions() -> None:
    assert fill_log("fgd", 11) == fill_log("fgd", 11)
    assert fill_log("fgd", 11) != fill_log("fgd", 12)
    assert replay_log("sjf", 5) == replay_log("sjf", 5)
