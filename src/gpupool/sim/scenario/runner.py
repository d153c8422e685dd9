"""Run one scenario end to end: build its workload, step its world to the horizon, and
return what it reports (summary, decision log, per-job rows, and the review's record).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.domain.engine import DecisionLog
from gpupool.reports.review_data import ReviewData
from gpupool.sim.scenario.config import ScenarioConfig
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.review_source import review_data
from gpupool.sim.scenario.summary import job_rows, scenario_summary
from gpupool.sim.scenario.workload import Workload
from gpupool.sim.scenario.world import ProgressFn, ScenarioSim
from gpupool.traces.location import find_traces_dir


@dataclass
class ScenarioResult:
    name: str
    summary: dict[str, Any]
    log: DecisionLog
    node_names: tuple[str, ...]
    wall_s: float
    utilization_by_hour: list[float] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    review: ReviewData | None = None
    """The monthly review's record of this run (run_scenario(review=True))."""


def run_scenario(
    cfg: ScenarioConfig,
    traces_dir: Path | None = None,
    progress: ProgressFn | None = None,
    workload: Workload | None = None,
    review: bool = False,
) -> ScenarioResult:
    """Run one scenario; with `review`, also build the monthly review's record of it
    (gpupool.sim.scenario.review_source), which records more while it runs."""
    started = time.perf_counter()
    if workload is None:
        ctx = GenContext(
            cfg.horizon_s,
            traces_dir or find_traces_dir(Path(cfg.path).parent if cfg.path else None),
        )
        workload = build_workload(cfg.workload, cfg.seed, ctx)
    sim = ScenarioSim(cfg, workload)
    if review:
        sim.record_for_review()
    sim.run(progress)
    wall = time.perf_counter() - started
    gpus = sum(sim.pool_gpus.values())
    return ScenarioResult(
        name=cfg.name,
        summary=scenario_summary(sim, wall),
        log=sim.engine.log,
        node_names=tuple(n.name for n in sim.cluster.nodes),
        wall_s=wall,
        utilization_by_hour=[round(g / (gpus * 3600), 4) for g in sim.hour_gpu_s],
        jobs=job_rows(sim),
        review=review_data(sim) if review else None,
    )
