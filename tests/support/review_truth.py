"""A simulated run of review-planted.yaml and the truth of the review's advice on it, read
from the usage profiles the simulator gave the jobs (not through the review's attribution).
Shared by tests/sim/scenario/test_review_truth.py and bench/bench_review_truth.py."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml

from gpupool.reports.review import Review, ReviewRules, build_review
from gpupool.reports.review_data import Allocation, ReviewData
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.review_source import profile_of, review_data
from gpupool.sim.scenario.usage import UsageProfile
from gpupool.sim.scenario.world import ScenarioSim
from gpupool.traces.location import find_traces_dir

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
RULES = ReviewRules()
CHECKED = ("right-size", "share-a-card", "reclaimable-card")
PLANTED = (
    ("never-used", ("idle-holder",)),
    ("right-size", ("over-asker",)),
    ("share-a-card", ("pair-a", "pair-b")),
    ("latency-drift", ("drifty",)),
)


class Run:
    """review-planted.yaml cut to `hours`, run, reviewed."""

    def __init__(self, hours: int) -> None:
        raw = yaml.safe_load((SCENARIOS / "review-planted.yaml").read_text())
        raw["horizon_h"] = hours
        cfg = parse_scenario(raw, str(SCENARIOS / "review-planted.yaml"))
        ctx = GenContext(cfg.horizon_s, find_traces_dir(SCENARIOS))
        self.sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, ctx))
        self.sim.record_for_review()
        self.sim.run(None)
        self.data: ReviewData = review_data(self.sim)
        self.review: Review = build_review(self.data, RULES)
        self.card_mib = {g.gpu_id: g.mem_total_mib for g in self.data.gpus}
        self.by_job: dict[str, list[Allocation]] = defaultdict(list)
        self.by_card: dict[str, list[Allocation]] = defaultdict(list)
        for a in self.data.allocations:
            self.by_job[a.job_id].append(a)
            self.by_card[a.gpu_id].append(a)

    def profile(self, job_id: str) -> tuple[UsageProfile, bool]:
        """The job's own profile, and whether its SM follows its service's load."""
        r = self.sim.runs[job_id]
        card = self.card_mib[self.by_job[job_id][0].gpu_id]
        return profile_of(self.sim, r.spec, r.service, float(card))

    def true(self, kind: str, subjects: tuple[str, ...]) -> bool:
        if kind == "right-size":
            (job_id,) = subjects
            asked = next(r.asked_mem_mib for r in self.review.jobs if r.job_id == job_id)
            return asked >= RULES.right_size_ratio * max(self.profile(job_id)[0].mem_peak_mib, 1)
        if kind == "share-a-card":
            (pa, la), (pb, lb) = (self.profile(j) for j in subjects)
            card = min(self.card_mib[self.by_job[j][0].gpu_id] for j in subjects)
            fits = pa.mem_peak_mib + pb.mem_peak_mib <= card * (1 - RULES.share_mem_headroom_frac)
            return fits and (la or lb or pa.sm_pct + pb.sm_pct <= RULES.share_sm_sum_pct)
        (gpu_id,) = subjects  # reclaimable: its holders' own SM over the period
        busy = 0.0
        for a in self.by_card[gpu_id]:
            prof, by_load = self.profile(a.job_id)
            held = min(a.end_s, self.data.end_s) - max(a.start_s, self.data.start_s)
            busy += (0.0 if by_load else prof.sm_pct) * held * a.share_milli / 1000
        return busy / (self.data.end_s - self.data.start_s) < RULES.reclaimable_mean_sm_pct

    def truth(self) -> dict[str, list[bool]]:
        """Per checked kind, whether each of its recommendations is true."""
        told: dict[str, list[bool]] = defaultdict(list)
        for rec in self.review.recommendations:
            if rec.kind in CHECKED:
                told[rec.kind].append(self.true(rec.kind, rec.subjects))
        return told

    def found(self) -> set[tuple[str, tuple[str, ...]]]:
        return {(r.kind, r.subjects) for r in self.review.recommendations}
