"""Metrics computed from a replay's decision log and the jobs' specs, nothing else."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.domain.engine import Decision
from gpupool.domain.model import JobSpec


@dataclass(frozen=True)
class ReplayMetrics:
    jobs: int
    finished: int
    unplaceable: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    p99_queue_s: float
    utilization: float
    makespan_s: float
    preemptions: int
    utilization_series: tuple[tuple[float, float], ...]
    """(bucket start s, busy GPU fraction) over the run, for plots."""
    jct_s: np.ndarray
    queue_s: np.ndarray

    def as_dict(self) -> dict[str, float | int]:
        return {
            "jobs": self.jobs,
            "finished": self.finished,
            "unplaceable": self.unplaceable,
            "avg_jct_s": self.avg_jct_s,
            "p50_jct_s": self.p50_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "avg_queue_s": self.avg_queue_s,
            "p99_queue_s": self.p99_queue_s,
            "utilization": self.utilization,
            "makespan_s": self.makespan_s,
            "preemptions": self.preemptions,
        }


def replay_metrics(
    decisions: Sequence[Decision],
    jobs: Mapping[str, JobSpec],
    total_gpus: int,
    buckets: int = 200,
) -> ReplayMetrics:
    """JCT = finish - submit; queueing = JCT - duration (all time not running)."""
    finish: dict[str, float] = {}
    gpus_of: dict[str, int] = {}
    changes: list[tuple[float, int]] = []
    unplaceable = preemptions = 0
    for d in decisions:
        if d.action == "start" and d.placement is not None:
            gpus_of[d.job_id] = d.placement.gpu_count
            changes.append((d.time_s, d.placement.gpu_count))
        elif d.action in ("finish", "preempt"):
            changes.append((d.time_s, -gpus_of.get(d.job_id, 0)))
            if d.action == "finish":
                finish[d.job_id] = d.time_s
            else:
                preemptions += 1
        elif d.action == "unplaceable":
            unplaceable += 1
    jct = np.array([finish[j] - jobs[j].submit_s for j in finish], dtype=np.float64)
    queue = np.array(
        [finish[j] - jobs[j].submit_s - (jobs[j].duration_s or 0.0) for j in finish],
        dtype=np.float64,
    )
    start = min((jobs[j].submit_s for j in jobs), default=0.0)
    end = max(finish.values(), default=start)
    makespan = end - start
    busy_gpu_s, series = _busy(changes, start, end, buckets, total_gpus)
    utilization = busy_gpu_s / (total_gpus * makespan) if makespan > 0 and total_gpus else 0.0

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else math.nan

    return ReplayMetrics(
        jobs=len(jobs),
        finished=len(finish),
        unplaceable=unplaceable,
        avg_jct_s=float(jct.mean()) if jct.size else math.nan,
        p50_jct_s=pct(jct, 50),
        p99_jct_s=pct(jct, 99),
        avg_queue_s=float(queue.mean()) if queue.size else math.nan,
        p99_queue_s=pct(queue, 99),
        utilization=utilization,
        makespan_s=makespan,
        preemptions=preemptions,
        utilization_series=series,
        jct_s=jct,
        queue_s=queue,
    )


def _busy(
    changes: list[tuple[float, int]], start: float, end: float, buckets: int, total_gpus: int
) -> tuple[float, tuple[tuple[float, float], ...]]:
    """Integrate the busy-GPU step function, overall and per time bucket."""
    if end <= start or not changes or total_gpus <= 0:
        return 0.0, ()
    width = (end - start) / buckets
    per_bucket = np.zeros(buckets, dtype=np.float64)
    total = 0.0
    busy = 0
    last = start
    for t, delta in sorted(changes, key=lambda c: c[0]):
        if t > last and busy:
            total += busy * (t - last)
            _spread(per_bucket, start, width, last, t, busy)
        last = max(last, t)
        busy += delta
    series = tuple(
        (start + k * width, float(per_bucket[k] / (width * total_gpus))) for k in range(buckets)
    )
    return total, series


def _spread(
    per_bucket: np.ndarray, start: float, width: float, t0: float, t1: float, busy: int
) -> None:
    k0 = min(int((t0 - start) / width), len(per_bucket) - 1)
    k1 = min(int((t1 - start) / width), len(per_bucket) - 1)
    if k0 == k1:
        per_bucket[k0] += busy * (t1 - t0)
        return
    per_bucket[k0] += busy * (start + (k0 + 1) * width - t0)
    per_bucket[k0 + 1 : k1] += busy * width
    per_bucket[k1] += busy * (t1 - (start + k1 * width))
