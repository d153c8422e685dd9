"""Services: replicas that follow demand. Each service gets the replicas its expected peak
needs (the demand rule), or more when what its replicas measured breaks the SLO (the SLO
rule); surplus replicas are cancelled once demand has stayed low, waiting ones first, then
those on the emptiest nodes, so the GPUs freed join other free GPUs instead of leaving
holes. A service whose replicas keep failing soon after they start backs off: its next
replica waits, doubling with each failure in a row up to a cap. The stage owns the services,
their demand and load, its scaling history and the failures in a row."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec
from gpupool.errors import NotFoundError, SpecError
from gpupool.learning.demand import FORECAST_MODES, DemandForecaster, DemandStatus
from gpupool.scheduler.book import JobBook, JobWatcher
from gpupool.scheduler.commands import Cancel, Command, LearnGuard, Scale
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.events import ServiceDemand, ServiceLoad, ServiceRate
from gpupool.scheduler.jobs import JobRecord, ServiceTemplate

SubmitReplica = Callable[[JobSpec, float, str], JobRecord]
"""How the stage adds a replica: the core's submit, which chooses its pool."""

SLO_RELEASE = 0.9
"""Replicas the SLO rule added stay until the measured rate is below this share of the
rate that needed them: the demand rule alone would take them back at once and flap."""


@dataclass(frozen=True)
class Backoff:
    """A service whose replicas failed `failures` times in a row: no new replica before
    `retry_at_s`."""

    failures: int
    retry_at_s: float
    last_reason: str


class ServiceAutoscale(JobWatcher):
    name: ClassVar[str] = "service-autoscale"

    def __init__(
        self,
        config: SchedulerConfig,
        book: JobBook,
        services: Sequence[ServiceTemplate],
        submit: SubmitReplica,
        replica_id: Callable[[str, int, int], str] | None,
    ) -> None:
        self.config = config
        self.book = book
        self.submit = submit
        self.services = {s.name: s for s in services}
        self.replica_id = replica_id
        """replica_id(service, seq, gpu_milli): the id of a new replica, given by the
        driver (the live service makes each replica a job row); default `<service>-r<seq>`."""
        self.demand: dict[str, float] = {}
        """Each service's peak: declared (ServiceDemand), or the one the reactive or
        forecast rule found at the last cycle."""
        self.load: dict[str, ServiceLoad] = {}
        """Each service's last measured load (ServiceLoad): what the SLO rule reads."""
        self.below_since: dict[str, float] = {}
        """Since when each service's demand has been below its replicas (scale-down waits)."""
        self.slo_floor: dict[str, tuple[int, float]] = {}
        """Replicas the SLO rule added, and the rate that needed them: held until it falls."""
        self.scaled_at: dict[str, float] = {}
        """When each service's replica count last changed (the SLO rule waits a window)."""
        self.replica_seq: dict[str, int] = defaultdict(int)
        self.backoff: dict[str, Backoff] = {}
        """The services backing off after replicas that failed in a row."""
        self.rates: dict[str, DemandForecaster] = {}
        """Each service's measured rates and, with `autoscale_demand: forecast`, its
        forecaster (the reactive and forecast rules read them)."""
        self.forecast_mode = config.autoscale_forecast.mode
        """active or shadow, for every forecaster (one learner: `gpupool learn promote
        forecast` and `demote forecast` set it)."""
        book.watchers.append(self)

    # ---- services come and go -----------------------------------------------------------------
    def known(self, name: str) -> ServiceTemplate:
        svc = self.services.get(name)
        if svc is None:
            raise NotFoundError(f"service {name} is not known to the scheduler")
        return svc

    def add(self, template: ServiceTemplate) -> None:
        self.services[template.name] = template

    def restore(self, name: str, replicas_made: int) -> None:
        """After a restart: the replicas this service made so far (ids stay unique)."""
        self.known(name)
        self.replica_seq[name] = replicas_made

    def remove(self, name: str, now: float, reason: str) -> list[Command]:
        """The service is gone: its waiting replicas end, its running ones are cancelled
        (the driver stops them with their grace)."""
        self.known(name)
        book = self.book
        mine = list(book.replicas[name].values())
        out: list[Command] = []
        dropped = []
        for r in mine:
            holding = r.state is JobState.RUNNING
            book.claims.pop(r.job_id, None)
            book.finished(r.job_id, now, JobState.CANCELLED, reason)
            if holding:
                out.append(Cancel(r.job_id, reason))
            else:
                dropped.append(r.job_id)
        out.insert(0, Scale(name, len(mine), 0, reason, tuple(dropped)))
        del self.services[name]
        book.replicas.pop(name, None)
        for table in (
            self.demand,
            self.load,
            self.below_since,
            self.scaled_at,
            self.slo_floor,
            self.backoff,
            self.rates,
        ):
            table.pop(name, None)
        book.dirty = True
        return out

    def ended(self, job_id: str) -> None:
        """A replica that failed soon after it started (or never started) adds to its
        service's failures in a row and moves its next try out; one that ran a while
        before failing starts the count again."""
        r = self.book.record(job_id)
        if r.service is None or r.service not in self.services or r.end_s is None:
            return
        if r.state is not JobState.FAILED:
            return
        cfg = self.config
        ran_s = r.end_s - r.run_started_s if r.first_start_s is not None else 0.0
        before = self.backoff.get(r.service)
        healthy_for_a_while = ran_s >= cfg.autoscale_restart_backoff_max_s
        failures = 1 if before is None or healthy_for_a_while else before.failures + 1
        wait_s = min(
            cfg.autoscale_restart_backoff_s * 2 ** (failures - 1),
            cfg.autoscale_restart_backoff_max_s,
        )
        self.backoff[r.service] = Backoff(failures, r.end_s + wait_s, r.end_reason)

    def observe_demand(self, event: ServiceDemand) -> None:
        self.known(event.service)
        self.demand[event.service] = event.peak_rps

    def observe_rate(self, event: ServiceRate) -> None:
        self.known(event.service)
        if self.config.autoscale_demand == "declared":
            return
        rates = self.rates.get(event.service)
        if rates is None:
            cfg = self.config
            learn = cfg.autoscale_demand == "forecast"
            rates = DemandForecaster(cfg.autoscale_forecast, cfg.autoscale_lookahead_s, learn)
            rates.mode = self.forecast_mode
            self.rates[event.service] = rates
        rates.observe(event.t_s, event.rps)

    # ---- the forecast as a learner: shadow or active ------------------------------------------
    def set_forecast_mode(self, mode: str, t_s: float, reason: str) -> LearnGuard:
        """Promote the forecast (a trusted forecast scales its service) or demote it to
        shadow (forecasts made and judged, the reactive rule scales); replans next cycle."""
        if self.config.autoscale_demand != "forecast":
            raise SpecError(
                f"autoscale.demand is {self.config.autoscale_demand}: there is no forecast to "
                "promote or demote; set autoscale.demand: forecast"
            )
        if mode not in FORECAST_MODES:
            raise SpecError(
                f"forecast mode must be one of {', '.join(FORECAST_MODES)}, got {mode!r}"
            )
        self.forecast_mode = mode
        for rates in self.rates.values():
            rates.mode = mode
        self.book.dirty = True
        return LearnGuard(t_s, "promoted" if mode == "active" else "demoted", reason, "forecast")

    def forecast_status(self) -> dict[str, DemandStatus]:
        """Each service's forecaster (none unless `autoscale.demand: forecast`)."""
        return {name: r.status() for name, r in self.rates.items() if r.learn}

    def forecast_promotion_problem(self) -> str | None:
        """Why the forecast may not be promoted now: no service's guard trusts its forecast
        (each one's reason said); None when at least one does (the others stay reactive
        until theirs do)."""
        if self.config.autoscale_demand != "forecast":
            return (
                f"autoscale.demand is {self.config.autoscale_demand}: there is no forecast; "
                "set autoscale.demand: forecast"
            )
        learners = {name: r for name, r in sorted(self.rates.items()) if r.learn}
        if not learners:
            return "no service has measured a rate yet: there is no forecast to judge"
        problems = {name: r.promotion_problem() for name, r in learners.items()}
        if any(p is None for p in problems.values()):
            return None
        return "no service's forecast is trusted by its guard: " + "; ".join(
            f"{name}: {why}" for name, why in problems.items()
        )

    def demand_peak(self, name: str, now: float, out: list[Command]) -> tuple[float, str]:
        """The peak rate a service's replicas are sized for, and how it was found (the
        forecaster's change of standing, if any, goes to `out`)."""
        source = self.config.autoscale_demand
        svc = self.services[name]
        if source == "declared":
            peak = self.demand.get(name, 0.0)
            return peak, f"expected peak {peak:.0f} rps at {svc.replica_rps:g} rps/replica"
        rates = self.rates.get(name)
        if rates is None:
            return 0.0, f"no rate measured yet, at {svc.replica_rps:g} rps/replica"
        change = rates.advance(now)
        if change is not None:
            out.append(LearnGuard(change.t_s, change.state, change.reason, f"forecast {name}"))
        ahead = rates.trusted_peak()
        window = self.config.autoscale_lookahead_s
        if ahead is not None:
            span = window + rates.cfg.step_s
            return ahead, (
                f"forecast peak {ahead:.0f} rps (p90) over the next {span:.0f} s "
                f"at {svc.replica_rps:g} rps/replica"
            )
        peak = rates.reactive_peak()
        return peak, (
            f"measured peak {peak:.0f} rps over the last {window:.0f} s "
            f"at {svc.replica_rps:g} rps/replica"
        )

    def observe_load(self, event: ServiceLoad) -> None:
        self.known(event.service)
        self.load[event.service] = event

    def replicas_needed(self, name: str, load_rps: float, shared: bool) -> int:
        svc = self.services[name]
        want = self.replicas_needed_raw(name, load_rps, shared)
        return min(max(want, svc.min_replicas), svc.max_replicas)

    def replicas_needed_raw(self, name: str, load_rps: float, shared: bool) -> int:
        """Replicas the load needs, before the service's bounds."""
        svc = self.services[name]
        cfg = self.config
        speed = cfg.colocation.speed(JobKind.ONLINE, self.sharers_per_gpu(name)) if shared else 1.0
        return math.ceil(load_rps * cfg.autoscale_headroom / (svc.replica_rps * speed) - 1e-9)

    def sharers_per_gpu(self, name: str) -> int:
        """How many of a service's replicas one GPU holds: `share_cap`, else as many as its
        share lets (no cap)."""
        cap = self.config.share_cap
        by_share = max(1, MILLI_PER_GPU // self.services[name].replica_gpu_milli)
        return by_share if cap is None else cap

    def sharing_pays(self, name: str, load_rps: float) -> bool:
        """Pack a service's replicas onto shared GPUs only where the model says it helps: the
        p99 next to `share_cap - 1` neighbours still meets the SLO, and the GPUs the shared
        replicas take (slowed by time-slicing) are fewer than whole-GPU replicas."""
        svc = self.services[name]
        cfg = self.config
        if svc.replica_gpu_milli >= MILLI_PER_GPU:
            return False
        neighbours = self.sharers_per_gpu(name) - 1
        p99 = svc.base_p99_ms * cfg.colocation.online_p99_factor([JobKind.ONLINE] * neighbours)
        if p99 > svc.slo_p99_ms:
            return False
        shared_gpus = self.replicas_needed(name, load_rps, True) * svc.replica_gpu_milli / 1000
        return shared_gpus < self.replicas_needed(name, load_rps, False)

    def slo_rule(self, name: str, have: int, now: float) -> tuple[int, str] | None:
        """Replicas the measured load asks for, and why: more when the p99 is over the SLO
        (one more) or the requests per replica are over `replica_rps` (enough for the rate
        with headroom). None: no fresh measurement, every replica not yet up, or a change
        made less than one measuring window ago (what was measured predates it)."""
        svc = self.services[name]
        load = self.load.get(name)
        cfg = self.config
        window = cfg.autoscale_load_window_s
        if load is None or now - load.t_s > window + 1e-9 or load.replicas_reporting < 1:
            return None
        running = sum(r.state is JobState.RUNNING for r in self.book.replicas[name].values())
        if running < have or load.replicas_reporting < running:
            return None  # a scale-up in flight: its replicas are not measured yet
        if now - self.scaled_at.get(name, -math.inf) < window - 1e-9:
            return None
        per = load.rps / load.replicas_reporting
        want, why = have, ""
        if per > svc.replica_rps:
            want = max(
                have + 1, math.ceil(load.rps * cfg.autoscale_headroom / svc.replica_rps - 1e-9)
            )
            why = f"{per:.0f} rps/replica > {svc.replica_rps:g} rps/replica at {load.rps:.0f} rps"
        if load.p99_ms is not None and load.p99_ms > svc.slo_p99_ms:
            want = max(want, have + 1)
            why = f"p99 {load.p99_ms:.0f} ms > {svc.slo_p99_ms:g} ms at {per:.0f} rps/replica"
        return (min(want, svc.max_replicas), why) if want > have else None

    def run(self, ctx: CycleContext) -> list[Command]:
        """Each service to the replicas its expected peak needs (the demand rule), or more
        when what its replicas measured breaks the SLO (the SLO rule): new replicas are
        submitted, surplus ones cancelled once demand has stayed low `down_stable_s`
        (waiting ones first, then those on the emptiest nodes, so the GPUs freed join
        other free GPUs instead of leaving holes). Each change comes with a Scale notice."""
        now = ctx.now_s
        if not self.services:
            return []
        out: list[Command] = []
        cfg = self.config
        for svc in self.services.values():
            if svc.name in self.backoff and self.healthy(svc.name, now):
                del self.backoff[svc.name]
            peak, why = self.demand_peak(svc.name, now, out)
            self.demand[svc.name] = peak  # what the serving clocks read as the demand
            shared = self.sharing_pays(svc.name, peak)
            want = self.replicas_needed(svc.name, peak, shared)
            mine = list(self.book.replicas[svc.name].values())
            have = len(mine)
            if want == svc.min_replicas and self.replicas_needed_raw(svc.name, peak, shared) < want:
                why = f"{why}; at least {svc.min_replicas} (the minimum)"
            load = self.load.get(svc.name)
            fresh = (
                load if load is not None and now - load.t_s <= cfg.autoscale_load_window_s else None
            )
            floor = self.slo_floor.get(svc.name)
            if floor is not None:
                held, at_rps = floor
                if fresh is not None and fresh.rps < SLO_RELEASE * at_rps:
                    del self.slo_floor[svc.name]  # the load that needed them has passed
                elif want < held:
                    want = held
                    why = (
                        f"held at {held} by the SLO rule until the rate falls below "
                        f"{SLO_RELEASE * at_rps:.0f} rps"
                    )
            slo = self.slo_rule(svc.name, have, now)
            if slo is not None and slo[0] > want and fresh is not None:
                want, why = slo
                self.slo_floor[svc.name] = (want, fresh.rps)
            if want < have:
                since = self.below_since.setdefault(svc.name, now)
                if now - since < cfg.autoscale_down_stable_s - 1e-9:
                    continue
                if cfg.autoscale_down_stable_s > 0:
                    why += f", low for {now - since:.0f} s"
            else:
                self.below_since.pop(svc.name, None)
            if want == have:
                continue
            backing_off = self.backoff.get(svc.name)
            if want > have and backing_off is not None:
                if now < backing_off.retry_at_s - 1e-9:
                    continue  # a crash loop: the next replica waits for its try
                why += f"; try {backing_off.failures + 1} after {backing_off.failures} failed"
            self.scaled_at[svc.name] = now
            self.below_since.pop(svc.name, None)
            dropped: list[str] = []
            cancels: list[Command] = []
            if have < want:
                for _ in range(want - have):
                    self.replica_seq[svc.name] += 1
                    seq = self.replica_seq[svc.name]
                    milli = svc.replica_gpu_milli if shared else MILLI_PER_GPU
                    job = JobSpec(
                        job_id=(
                            self.replica_id(svc.name, seq, milli)
                            if self.replica_id is not None
                            else f"{svc.name}-r{seq}"
                        ),
                        gpu_count=1,
                        gpu_milli=milli,
                        gpu_models=svc.gpu_models,
                        team=svc.team,
                        priority=svc.priority,
                        kind=JobKind.ONLINE,
                        submit_s=now,
                    )
                    self.submit(job, now, svc.name)
            else:
                mine.sort(key=lambda r: (r.state is JobState.RUNNING, -self.node_free(r)))
                for r in mine[: have - want]:
                    self.book.claims.pop(r.job_id, None)
                    holding = r.state is JobState.RUNNING
                    self.book.finished(r.job_id, now, JobState.CANCELLED, "scaled down")
                    if holding:
                        cancels.append(Cancel(r.job_id, "scaled down"))
                    else:
                        dropped.append(r.job_id)
            out.append(Scale(svc.name, have, want, why, tuple(dropped)))
            out += cancels
        return out

    def healthy(self, name: str, now: float) -> bool:
        """A replica of the service has run `restart_backoff_max_s`: its failures are past."""
        settled = self.config.autoscale_restart_backoff_max_s
        return any(
            r.state is JobState.RUNNING and now - r.run_started_s >= settled
            for r in self.book.replicas[name].values()
        )

    def node_free(self, r: JobRecord) -> int:
        placement = self.book.state.placements.get(r.spec.job_id)
        if placement is None:
            return 0
        return int(self.book.state.whole_free[placement.shares[0].node])
