"""A finished scenario run as a review source: the `ReviewData` the monthly review reads.

Everything comes from what the run recorded (`ScenarioSim.record_for_review`, see
gpupool.sim.scenario.usage): the interval each job held each card (exactly the GPU time the
summary counts), why each waiting job waited (the core's Wait codes), what each card drew
(the energy meter's model), how hot it ran (the heat model, when on), what each job
measured (its usage profile), and each service's p99 per bucket (the serving model).

Times are scenario seconds (0 = midnight of day 0, which the workload's day and night
shapes key on); `origin_s` maps 0 to `ORIGIN_S`, 2026-11-01 00:00 UTC, and the review adds
it, so a 30-day scenario reviews as November 2026 with local time = UTC.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, JobSpec
from gpupool.errors import SpecError
from gpupool.reports.review_data import (
    Allocation,
    DownInterval,
    GpuRecord,
    JobReview,
    LatencySample,
    ReviewData,
    ReviewQuota,
    ReviewTariff,
    UsageSample,
)
from gpupool.sim.scenario.usage import (
    IDLE_MEM_FRACTION,
    RATED_SM_PCT,
    SERVING_MEM_FRACTION,
    Held,
    Recorder,
    UsageProfile,
    default_profile,
)

if TYPE_CHECKING:
    from gpupool.sim.scenario.runs import Run
    from gpupool.sim.scenario.world import ScenarioSim

ORIGIN_S = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
"""Unix time of scenario time 0 (scenarios carry no date of their own)."""
DAY_WINDOW = (9, 21)
"""The workload generators' day (mixed: 09:00-21:00), the review's day window."""
CLOUD_DOWN = "cloud node not started"
NO_REASON = "Scheduling"
"""Waiting before the core gave a reason, or after it said nothing holds the job back:
it is considered again at the next cycle (the Scheduling code's meaning)."""


def review_data(sim: ScenarioSim, origin_s: float = ORIGIN_S) -> ReviewData:
    """The review record of a run that recorded for it (see the module doc)."""
    rec = sim.recorder
    if rec is None:
        raise SpecError(
            "this scenario run kept nothing for a review; run it with "
            "`gpupool simulate scenario FILE --json RESULT.json`"
        )
    cfg = sim.cfg
    horizon = cfg.horizon_s
    nodes = sim.cluster.nodes
    card_mib = np.zeros(len(nodes))
    gpus: list[GpuRecord] = []
    types: dict[str, float] = {}
    for n, node in enumerate(nodes):
        pool = cfg.pool(sim.node_pool[n])
        known = pool.gpu_type in sim.catalog
        card_mib[n] = round(sim.catalog[pool.gpu_type].memory_gib * 1024.0) if known else 0
        if known:
            types[pool.gpu_type] = sim.catalog[pool.gpu_type].price_usd_per_hour
        for g in range(node.gpu_count):
            gpus.append(
                GpuRecord(
                    _gpu_id(sim, n, g),
                    node.name,
                    g,
                    pool.gpu_type,
                    node.cluster,
                    round(card_mib[n]),
                )
            )
    intervals = rec.intervals()
    runs = sim.runs
    allocations = [
        Allocation(
            job_id,
            _gpu_id(sim, share.node, g),
            round(h.start_s, 3),
            round(h.end_s, 3),
            h.share_milli,
        )
        for job_id, h in intervals
        for share in h.placement.shares
        for g in share.gpus
    ]
    down_spans = _down_spans(sim, rec)
    down = [
        DownInterval(_gpu_id(sim, n, g), round(a, 3), round(b, 3), CLOUD_DOWN)
        for n, spans in sorted(down_spans.items())
        for a, b in spans
        for g in range(nodes[n].gpu_count)
    ]
    held: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job_id, h in intervals:
        held[job_id].append((h.start_s, h.end_s))
    jobs = [
        _job(sim, job_id, r, held.get(job_id, []), rec.waits.get(job_id, []))
        for job_id, r in runs.items()
    ]
    usage = _usage(sim, rec, intervals, card_mib, down_spans)
    latency = [
        LatencySample(
            svc,
            float(b * rec.bucket_s),
            round(float(row[b, 3] / row[b, 0]), 3),
            round(float(row[b, 0] / _period(rec, b)), 3),
        )
        for svc, row in sorted(rec.serving.items())
        for b in range(rec.buckets)
        if row[b, 0] > 0
    ]
    teams = [ReviewQuota(t.team, dict(t.guaranteed), dict(t.maximum)) for t in cfg.scheduling.teams]
    return ReviewData(
        source=f"simulation {cfg.name} (seed {cfg.seed}, policy {cfg.scheduling.policy})",
        start_s=0.0,
        end_s=horizon,
        gpus=tuple(gpus),
        allocations=tuple(allocations),
        down=tuple(down),
        jobs=tuple(jobs),
        usage=tuple(usage),
        latency=tuple(latency),
        teams=tuple(teams),
        tariff=_tariff(sim),
        gpu_price_per_hour=dict(sorted(types.items())),
        day_window=DAY_WINDOW,
        utc_offset_h=0.0,
        origin_s=origin_s,
    )


def _gpu_id(sim: ScenarioSim, node: int, gpu: int) -> str:
    return f"{sim.cluster.nodes[node].name}/{gpu}"


def _period(rec: Recorder, b: int) -> float:
    return min(rec.bucket_s, rec.horizon_s - b * rec.bucket_s)


def _down_spans(sim: ScenarioSim, rec: Recorder) -> dict[int, list[tuple[float, float]]]:
    """Per cloud node, the spans it was not in the pool (off, or still starting)."""
    out: dict[int, list[tuple[float, float]]] = {}
    changes: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    for at, n, up in rec.node_status:
        changes[n].append((at, up))
    for n in sim.cloud_nodes:
        spans: list[tuple[float, float]] = []
        since: float | None = 0.0  # every cloud node starts off
        for at, up in changes.get(n, []):
            if up and since is not None:
                if at > since:
                    spans.append((since, at))
                since = None
            elif not up and since is None:
                since = at
        if since is not None and sim.cfg.horizon_s > since:
            spans.append((since, sim.cfg.horizon_s))
        if spans:
            out[n] = spans
    return out


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + 1e-9:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def wait_by_reason(
    submit_s: float,
    end_s: float,
    held: list[tuple[float, float]],
    told: list[tuple[float, str]],
) -> dict[str, float]:
    """The time in [submit_s, end_s) the job held no card, split by the reason code the
    core had last given it at each moment (NO_REASON before the first, or after an empty
    one). The parts sum to the job's whole wait."""
    out: dict[str, float] = defaultdict(float)
    gaps: list[tuple[float, float]] = []
    t = submit_s
    for a, b in _merge(held):
        if a > t:
            gaps.append((t, min(a, end_s)))
        t = max(t, b)
    if end_s > t:
        gaps.append((t, end_s))
    changes = sorted(told, key=lambda x: x[0])
    for a, b in gaps:
        if b <= a:
            continue
        code = NO_REASON
        for at, c in changes:
            if at <= a:
                code = c or NO_REASON
        cursor = a
        for at, c in changes:
            if a < at < b:
                out[code] += at - cursor
                cursor, code = at, c or NO_REASON
        out[code] += b - cursor
    return {k: round(v, 3) for k, v in sorted(out.items()) if v > 0}


def _job(
    sim: ScenarioSim,
    job_id: str,
    r: Run,
    held: list[tuple[float, float]],
    told: list[tuple[float, str]],
) -> JobReview:
    spec = r.spec
    end = r.end_s if r.end_s is not None else sim.cfg.horizon_s
    end = min(end, sim.cfg.horizon_s)
    ledger = sim.meter.jobs.get(job_id)
    sized = sim.sized.get(job_id)
    gpu_type = sim.cfg.pool(r.gpu_type).gpu_type if r.gpu_type else None
    return JobReview(
        job_id=job_id,
        team=spec.team,
        kind=spec.kind.value,
        gpu_count=spec.gpu_count,
        submit_s=round(spec.submit_s, 3),
        state=r.state.value,
        first_start_s=None if r.first_start_s is None else round(r.first_start_s, 3),
        end_s=None if r.end_s is None else round(r.end_s, 3),
        service=r.service,
        model=None if sized is None else sized.shape.name,
        gpu_mem_mib=spec.gpu_mem_mib,
        gpu_type=gpu_type,
        priority=spec.priority,
        preemptions=r.preemptions,
        lost_gpu_s=round(r.lost_work_s * spec.gpu_count, 3),
        wait_s_by_reason=wait_by_reason(spec.submit_s, end, held, told),
        energy_kwh=None if ledger is None else round(ledger.energy_kwh, 6),
    )


def profile_of(
    sim: ScenarioSim, spec: JobSpec, service: str | None, card_mib: float
) -> tuple[UsageProfile, bool]:
    """A job's usage profile (its entry's override over the kind's default), and whether
    its SM follows its service's load instead (a replica without an `sm_pct` override)."""
    over = sim.workload.usage.get(spec.job_id)
    if over is None and service is not None:
        over = sim.workload.usage.get(service)
    if service is not None:
        mem = round(SERVING_MEM_FRACTION * card_mib * spec.gpu_milli / MILLI_PER_GPU, 1)
        base = UsageProfile(0.0, mem, mem)
        return (base, True) if over is None else (over.apply(base), over.sm_pct is None)
    base = default_profile(spec, card_mib, sim.cfg.seed)
    return (base if over is None else over.apply(base)), False


class _Spread:
    """Per-card, per-bucket integrals of values held over intervals (O(1) per interval)."""

    def __init__(self, shape: tuple[int, int], rec: Recorder) -> None:
        self.rec = rec
        self.acc = np.zeros((*shape, rec.buckets))
        self.diff = np.zeros((*shape, rec.buckets + 1))
        self.seen = np.zeros((*shape, rec.buckets + 1))

    def add(self, n: int, g: int, a: float, b: float, rate: float, present: float = 0.0) -> None:
        """`rate` per second over [a, b); `present` added to every bucket it touches."""
        if b <= a:
            return
        p = self.rec.bucket_s
        b0, b1 = self.rec.bucket(a), int(b // p)
        last = min(b1 if b > b1 * p else b1 - 1, self.rec.buckets - 1)
        if b0 == last:
            self.acc[n, g, b0] += rate * (b - a)
        else:
            self.acc[n, g, b0] += rate * ((b0 + 1) * p - a)
            if b1 < self.rec.buckets:
                self.acc[n, g, b1] += rate * (b - b1 * p)
            self.diff[n, g, b0 + 1] += rate * p
            self.diff[n, g, b1] -= rate * p
        if present:
            self.seen[n, g, b0] += present
            self.seen[n, g, last + 1] -= present

    def integral(self) -> np.ndarray:
        out: np.ndarray = self.acc + np.cumsum(self.diff, axis=2)[:, :, :-1]
        return out

    def touched(self) -> np.ndarray:
        out: np.ndarray = np.cumsum(self.seen, axis=2)[:, :, :-1]
        return out


def _usage(
    sim: ScenarioSim,
    rec: Recorder,
    intervals: list[tuple[str, Held]],
    card_mib: np.ndarray,
    down_spans: dict[int, list[tuple[float, float]]],
) -> list[UsageSample]:
    """Per card and bucket: the mean SM and memory its jobs measured, the peak memory of
    the jobs on it, its draw and temperature. Every card, every bucket, idle ones too."""
    shape = (rec.nodes, rec.width)
    sm, mem = _Spread(shape, rec), _Spread(shape, rec)
    services = sorted(rec.serving)
    occupancy = {svc: _Spread(shape, rec) for svc in services}
    runs = sim.runs
    profiles: dict[str, tuple[UsageProfile, bool]] = {}
    for job_id, h in intervals:
        r = runs[job_id]
        if job_id not in profiles:
            n0 = h.placement.shares[0].node
            profiles[job_id] = profile_of(sim, r.spec, r.service, float(card_mib[n0]))
        prof, by_load = profiles[job_id]
        for share in h.placement.shares:
            for g in share.gpus:
                a, b = h.start_s, h.end_s
                if by_load and r.service in occupancy:
                    occupancy[r.service].add(share.node, g, a, b, h.share_milli / MILLI_PER_GPU)
                elif not by_load:
                    sm.add(share.node, g, a, b, prof.sm_pct)
                mem.add(share.node, g, a, b, prof.mem_mib, prof.mem_peak_mib)
    periods = np.array([_period(rec, b) for b in range(rec.buckets)])
    sm_mean = sm.integral() / periods
    for svc in services:
        row = rec.serving[svc]
        util = np.divide(row[:, 1], row[:, 2], out=np.zeros(rec.buckets), where=row[:, 2] > 0)
        sm_mean += occupancy[svc].integral() / periods * RATED_SM_PCT * util
    sm_mean = np.clip(sm_mean, 0.0, 100.0)
    up_s = np.repeat(periods[None, :], rec.nodes, axis=0)
    for n, spans in down_spans.items():
        for a, b in spans:
            for k in range(rec.buckets):
                lo, hi = k * rec.bucket_s, k * rec.bucket_s + periods[k]
                up_s[n, k] -= max(0.0, min(b, hi) - max(a, lo))
    baseline = IDLE_MEM_FRACTION * card_mib[:, None] * up_s / periods  # [node, bucket]
    mem_mean = np.minimum(mem.integral() / periods + baseline[:, None, :], card_mib[:, None, None])
    peak = np.minimum(mem.touched() + baseline[:, None, :], card_mib[:, None, None])
    power = rec.energy_j / periods
    temp = rec.temp_cs / periods if rec.temp_seen else None
    tdp = sim.meter.tdp_w
    out: list[UsageSample] = []
    for n, node in enumerate(sim.cluster.nodes):
        for g in range(node.gpu_count):
            gid = _gpu_id(sim, n, g)
            for b in range(rec.buckets):
                out.append(
                    UsageSample(
                        gid,
                        float(b * rec.bucket_s),
                        float(periods[b]),
                        round(float(mem_mean[n, g, b]), 1),
                        round(float(sm_mean[n, g, b]), 2),
                        round(float(power[n, g, b]), 1) if tdp[n] > 0 else None,
                        None if temp is None else round(float(temp[n, g, b]), 1),
                        round(float(peak[n, g, b]), 1),
                    )
                )
    return out


def _tariff(sim: ScenarioSim) -> ReviewTariff | None:
    """The scenario's energy tariff as 24 prices by scenario (= review local) hour of its
    first day; the default tariff, else the first site's."""
    found = [t for _, t in sorted(sim.tariff_of.items()) if t is not None]
    default = sim.cfg.scheduling.energy.tariff
    t = next((x for x in found if x.name == default), found[0] if found else None)
    if t is None:
        return None
    prices = tuple(round(t.price_at(h * 3600.0), 6) for h in range(24))
    carbon: tuple[float, ...] = ()
    if t.carbon_g_per_kwh is not None:
        carbon = tuple(float(t.carbon_at(h * 3600.0) or 0.0) for h in range(24))
    return ReviewTariff(t.name, prices, t.currency, carbon, sim.cfg.scheduling.energy.pue)
