"""Training jobs with measured solo profiles sharing GPUs, through the one core.

Single-GPU training jobs (profiles of the Lucid measurements, `traces/lucid.py`) arrive as
a Poisson stream above what whole cards can serve. Three ways to run them: whole cards
(each job alone), sharing with the utilisation-sum rule as the core's pair admission, and
sharing with the learned admission. The world decides nothing: it launches what the core
says, and each job's speed next to a partner is the speed *measured* for that pair
(capped at 1: values above are measurement noise), so the admission is judged against
measurements, not against its own predictions. Progress goes back to the core every cycle
(the guard's input). Only profiles whose every pairing was measured are drawn.

Reported: GPU-time throughput (work done at solo speed, per GPU-second of the horizon,
running jobs' partial work included) and the share of co-located job-time spent below
0.85x speed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node
from gpupool.errors import SpecError
from gpupool.learning.colocation import SLOW_SPEED
from gpupool.learning.colocation_admission import PairAdmissionPolicy
from gpupool.scheduler import Scheduler, Submitted
from gpupool.scheduler.commands import Cancel, Expire, Launch, Resize, Stop
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.events import Finished, JobProgress, Progress
from gpupool.traces.lucid import PairMeasurement, SoloProfile


@dataclass(frozen=True)
class ColocationScenario:
    nodes: int = 4
    gpus_per_node: int = 8
    horizon_s: float = 72 * 3600.0
    load: float = 1.6
    """Work arriving over the horizon, over what the GPUs could do alone in it."""
    median_work_s: float = 2 * 3600.0
    work_sigma: float = 0.8
    """Log-normal spread of each job's work (seconds at solo speed)."""
    cycle_s: float = 60.0
    seed: int = 0
    drift: tuple[float, float, float] | None = None
    """(from_s, to_s, factor): between these times every co-located job runs at its
    measured speed times `factor` (a synthetic drift, for the guard); None: none."""


@dataclass(frozen=True)
class ColocationResult:
    mode: str
    seed: int
    jobs_submitted: int
    jobs_finished: int
    throughput: float
    """Work done at solo speed per GPU-second of the horizon (1.0: every card busy alone)."""
    colocated_job_s: float
    slow_job_s: float
    pairs_started: int
    guard_changes: tuple[str, ...] = field(default_factory=tuple)
    """The admission guard's sentences from the core's decision log, with their hour."""

    @property
    def slow_share(self) -> float:
        return self.slow_job_s / self.colocated_job_s if self.colocated_job_s else 0.0


class PairSpeeds:
    """The measured speed of each job of a pair, by profile keys (either order)."""

    def __init__(self, pairs: Sequence[PairMeasurement]) -> None:
        self.speed: dict[tuple[str, str], tuple[float, float]] = {}
        for p in pairs:
            self.speed.setdefault((p.first, p.second), (p.first_speed, p.second_speed))
            self.speed.setdefault((p.second, p.first), (p.second_speed, p.first_speed))

    def of(self, a: str, b: str) -> tuple[float, float]:
        found = self.speed.get((a, b))
        if found is None:
            raise SpecError(f"no measured speed for {a} next to {b}")
        return min(found[0], 1.0), min(found[1], 1.0)

    def fully_crossed(self, keys: Sequence[str]) -> list[str]:
        """The largest set found (greedy) in which every pair, a key with itself included,
        was measured: the profiles a simulation may draw."""
        left = sorted(set(keys))
        while left:
            missing = {k: sum((k, o) not in self.speed for o in left) for k in left}
            worst = max(left, key=lambda k: (missing[k], k))
            if missing[worst] == 0:
                return left
            left.remove(worst)
        return left


def drift_factor(sc: ColocationScenario, t_s: float) -> float:
    if sc.drift is None:
        return 1.0
    start, end, factor = sc.drift
    return factor if start <= t_s < end else 1.0


def pair_speeds(
    on_card: Mapping[tuple[int, int], list[str]],
    names: Mapping[str, str],
    speeds: PairSpeeds,
    factor: float,
) -> dict[str, float]:
    """Each running job's speed: 1 alone, its measured speed (times `factor`) in a pair."""
    out: dict[str, float] = {}
    for ids in on_card.values():
        if len(ids) == 1:
            out[ids[0]] = 1.0
        elif len(ids) == 2:
            a, b = speeds.of(names[ids[0]], names[ids[1]])
            out[ids[0]], out[ids[1]] = a * factor, b * factor
        else:
            raise SpecError(f"the world models pairs only, not {len(ids)} jobs on one card")
    return out


def workload(sc: ColocationScenario, keys: Sequence[str], share: bool) -> list[JobSpec]:
    """The same arrivals, works and profiles in every mode (one seed)."""
    rng = np.random.default_rng(sc.seed)
    gpus = sc.nodes * sc.gpus_per_node
    mean_work = sc.median_work_s * float(np.exp(sc.work_sigma**2 / 2))
    rate = sc.load * gpus / mean_work
    out: list[JobSpec] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= sc.horizon_s:
            return out
        work = float(sc.median_work_s * np.exp(sc.work_sigma * rng.standard_normal()))
        out.append(
            JobSpec(
                f"j{len(out):05d}",
                gpu_milli=MILLI_PER_GPU // 2 if share else MILLI_PER_GPU,
                kind=JobKind.TRAINING,
                submit_s=round(t, 3),
                duration_s=work,
                checkpoint_interval_s=1e9,
                name=keys[int(rng.integers(len(keys)))],
            )
        )


def run(
    sc: ColocationScenario,
    mode: str,
    pairs: Sequence[PairMeasurement],
    profiles: Mapping[str, SoloProfile],
    admission: PairAdmissionPolicy | None = None,
) -> ColocationResult:
    """mode "whole": a card a job; otherwise shares of half a card with `admission`."""
    speeds = PairSpeeds(pairs)
    keys = speeds.fully_crossed([k for p in pairs for k in (p.first, p.second) if k in profiles])
    share = mode != "whole"
    jobs = workload(sc, keys, share)
    cluster = Cluster(
        "colocation",
        tuple(
            Node(f"n{k:02d}", "RTX3090", sc.gpus_per_node, 1_000_000, 1 << 30)
            for k in range(sc.nodes)
        ),
    )
    config = SchedulerConfig(cycle_s=sc.cycle_s, online_reserve=0.0, queue_depth=64)
    core = Scheduler(cluster, config, seed=sc.seed, colocation=admission if share else None)
    card: dict[str, tuple[int, int]] = {}
    left: dict[str, float] = {}
    names = {j.job_id: j.name for j in jobs}
    work_of = {j.job_id: j.duration_s or 0.0 for j in jobs}
    done_s: dict[str, float] = {}
    colocated = slow = 0.0
    pairs_started = finished = 0
    t, nxt = 0.0, 0
    while t < sc.horizon_s:
        on_card: dict[tuple[int, int], list[str]] = {}
        for j, c in card.items():
            on_card.setdefault(c, []).append(j)
        speed = pair_speeds(on_card, names, speeds, drift_factor(sc, t))
        if card:
            core.observe(
                Progress(t, {j: JobProgress(done_s[j], 0.0, speed[j], 0.0, 1.0) for j in card})
            )
        while nxt < len(jobs) and jobs[nxt].submit_s <= t:
            core.observe(Submitted(jobs[nxt].submit_s, jobs[nxt]))
            nxt += 1
        for cmd in core.cycle(t):
            if isinstance(cmd, Launch):
                sh = cmd.placement.shares[0]
                c = (sh.node, sh.gpus[0])
                pairs_started += c in on_card
                card[cmd.job_id] = c
                on_card.setdefault(c, []).append(cmd.job_id)
                left.setdefault(cmd.job_id, work_of[cmd.job_id])
                done_s.setdefault(cmd.job_id, 0.0)
            elif isinstance(cmd, Stop | Resize | Expire | Cancel):
                raise SpecError(f"the co-location world cannot carry out {cmd!r}")
        speed = pair_speeds(on_card, names, speeds, drift_factor(sc, t))  # with the starts
        step = min(sc.cycle_s, sc.horizon_s - t)
        if sc.drift is not None:  # the drift's edges are steps of their own
            step = min([step, *(e - t for e in sc.drift[:2] if e > t)])
        if card:
            step = min(step, min(left[j] / speed[j] for j in card))
        step = max(step, 1e-6)
        for ids in on_card.values():
            for j in ids:
                left[j] -= speed[j] * step
                done_s[j] += speed[j] * step
                if len(ids) == 2:
                    colocated += step
                    slow += step if speed[j] < SLOW_SPEED else 0.0
        t += step
        for j in sorted(j for j in card if left[j] <= 1e-6):
            del card[j]
            finished += 1
            core.observe(Finished(t, j))
    work = sum(done_s.values())
    changes = tuple(
        f"{d.time_s / 3600:.1f} h: {d.action}"
        for d in core.engine.log.decisions
        if d.job_id == "colocation"
    )
    return ColocationResult(
        mode=mode,
        seed=sc.seed,
        jobs_submitted=nxt,
        jobs_finished=finished,
        throughput=work / (cluster.gpu_count * sc.horizon_s),
        colocated_job_s=colocated,
        slow_job_s=slow,
        pairs_started=pairs_started,
        guard_changes=changes,
    )
