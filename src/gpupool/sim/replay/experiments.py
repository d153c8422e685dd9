"""Batches of simulator runs: the FGD paper's policy x seed comparison, in parallel."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from gpupool.domain.model import Cluster, JobSpec
from gpupool.sim.replay.common import ProgressFn
from gpupool.sim.replay.fill import run_fill
from gpupool.traces.openb import read_nodes, read_pods


def embedded(name: str) -> Path:
    """A data file shipped inside the package (see gpupool/data/SOURCES.md)."""
    return Path(str(resources.files("gpupool") / "data" / name))


DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"


@dataclass(frozen=True)
class FillRun:
    policy: str
    seed: int
    tune: float
    tasks: int
    placed: int
    wall_s: float
    curves: dict[str, list[float]]

    def at(self, key: str, arrived_pct: int) -> float:
        idx = self.curves["arrived_pct"].index(float(arrived_pct))
        return self.curves[key][idx]

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "tune": self.tune,
            "tasks": self.tasks,
            "placed": self.placed,
            **self.curves,
            "wall_s": round(self.wall_s, 3),
        }


@lru_cache(maxsize=4)
def _load(nodes: str, pods: str) -> tuple[Cluster, tuple[JobSpec, ...]]:
    cluster, _ = read_nodes(nodes)
    jobs, _ = read_pods(pods)
    return cluster, tuple(jobs)


def one_fill(args: tuple[str, str, str, int, float]) -> FillRun:
    nodes, pods, policy, seed, tune = args
    cluster, jobs = _load(nodes, pods)
    result = run_fill(cluster, jobs, policy, seed, tune, keep_log=False)
    return FillRun(policy, seed, tune, result.tasks, result.placed, result.wall_s, result.curves())


def fill_batch(
    nodes: str | Path,
    pods: str | Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> list[FillRun]:
    tasks = [(str(nodes), str(pods), p, s, tune) for p in policies for s in seeds]
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    runs: list[FillRun] = []
    if workers == 1:
        for k, t in enumerate(tasks, start=1):
            runs.append(one_fill(t))
            if progress:
                progress(k, len(tasks))
        return runs
    with ProcessPoolExecutor(workers) as pool:
        for k, run in enumerate(pool.map(one_fill, tasks), start=1):
            runs.append(run)
            if progress:
                progress(k, len(tasks))
    return runs


def median_curves(runs: Sequence[FillRun]) -> dict[str, list[float]]:
    """Point-wise median over seeds, on the arrived percentages every run reached."""
    common = set(runs[0].curves["arrived_pct"])
    for r in runs[1:]:
        common &= set(r.curves["arrived_pct"])
    points = sorted(common)
    out: dict[str, list[float]] = {"arrived_pct": points}
    for key in ("alloc_pct", "unallocated_pct", "frag_amount_pct", "frag_rate_pct"):
        out[key] = [round(statistics.median(r.at(key, int(p)) for r in runs), 2) for p in points]
    return out
