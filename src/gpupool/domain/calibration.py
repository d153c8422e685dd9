"""Preemption-cost and co-location models, calibrated on a real H200 (shared/calibration).

The numbers live in gpupool/data/calibration.json with their source; the models read
them once. Override any of them in a scenario's `checkpoint:` or `colocation:` section.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from gpupool.domain.model import JobKind

GIB_PER_GB = 1e9 / 2**30


@lru_cache(maxsize=1)
def calibration() -> dict[str, Any]:
    text = (resources.files("gpupool") / "data" / "calibration.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@dataclass(frozen=True)
class CheckpointModel:
    """Preemption writes the job's state, resume reads it back and restarts the process.

    Defaults: write 0.45 GB/s, restore 1.2 GB/s, 5 s process start (H200 measurements).
    Writers on different GPUs run in parallel, so the cost follows the per-GPU state.
    """

    write_gbps: float
    restore_gbps: float
    process_start_s: float

    @staticmethod
    def calibrated() -> CheckpointModel:
        c = calibration()["checkpoint"]
        return CheckpointModel(c["write_gbps"], c["restore_gbps"], c["process_start_s"])

    def write_s(self, state_gib: float) -> float:
        return state_gib / GIB_PER_GB / self.write_gbps

    def resume_s(self, state_gib: float) -> float:
        return state_gib / GIB_PER_GB / self.restore_gbps + self.process_start_s


@dataclass(frozen=True)
class ColocationModel:
    """What sharing one GPU by time-slicing costs (H200 measurements).

    Throughput: N processes split the GPU and lose 8% (compute-bound), 7% (training) or
    27% (memory-bound decoding) to switching. Latency: an online request's p99 grows 4.7x
    next to a training step and by about 1x per memory-bound neighbour.
    """

    aggregate: dict[str, float]
    next_to_train_p99: float
    per_neighbour_p99: float

    @staticmethod
    def calibrated() -> ColocationModel:
        c = calibration()["colocation"]
        return ColocationModel(
            dict(c["aggregate_throughput"]),
            c["online_p99_factor"]["next_to_train"],
            c["online_p99_factor"]["next_to_membound_per_neighbour"],
        )

    def profile(self, kind: JobKind) -> str:
        return "train" if kind is JobKind.TRAINING else "membound"

    def speed(self, kind: JobKind, sharers: int) -> float:
        """Each sharer's speed relative to running alone on the GPU."""
        if sharers <= 1:
            return 1.0
        return self.aggregate[self.profile(kind)] / sharers

    def online_p99_factor(self, neighbours: list[JobKind]) -> float:
        if any(k is JobKind.TRAINING for k in neighbours):
            return self.next_to_train_p99
        return 1.0 + self.per_neighbour_p99 * len(neighbours)
