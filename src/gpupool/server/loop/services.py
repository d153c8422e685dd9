"""The live services: their rows, the core's templates of them, their replicas' job rows,
and what their replicas measure (the scrape stage that feeds the core their load).

A service is stored by the API (`Operations`); its replicas are jobs the core asks for
(`new_replica`, the core's `replica_id` callback) and the loop runs like any other job,
at its node's address and a port (`state.endpoints`, server/loop/endpoints.py) whose
/metrics the scraper reads."""

from __future__ import annotations

from gpupool.domain.lifecycle import JobState
from gpupool.errors import SpecError
from gpupool.ports.clock.base import Clock
from gpupool.scheduler import Scheduler, ServiceLoad, ServiceRate, ServiceTemplate
from gpupool.server.loop.config import FleetMap, LiveConfig
from gpupool.server.loop.state import LoopState
from gpupool.server.store import JobRow, NewJob, NewService, ServiceRow, Store
from gpupool.server.telemetry.replica_load import Endpoint, Measured, Scraper


class Services:
    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        clock: Clock,
        scraper: Scraper,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.clock = clock
        self.scraper = scraper
        self.rows: dict[str, ServiceRow] = {}
        """The live services, as stored (their replicas' command, env, port variable)."""
        self.service_load: dict[str, Measured] = {}
        self.replica_load: dict[str, Measured] = {}
        """What each service and each replica measured at the last scrape (replaced whole:
        the views read them without the lock)."""

    def template(self, svc: NewService | ServiceRow) -> ServiceTemplate:
        """The core's template of a service; a replica's share of a card from its GPU
        memory over the largest card it may use."""
        milli = svc.gpu_milli
        nodes = self.fleet.cluster.nodes
        if svc.gpu_model is not None and svc.gpu_model not in {n.gpu_model for n in nodes}:
            have = ", ".join(sorted({n.gpu_model for n in nodes}))
            raise SpecError(f"service {svc.name} asks for {svc.gpu_model}; this fleet has {have}")
        if svc.gpu_mem_mib is not None:
            models = sorted({n.gpu_model for n in nodes})
            allowed = [m for m in models if svc.gpu_model is None or m == svc.gpu_model]
            cards = [c for m in allowed if (c := self.scheduler.fleet.card_mem_mib(m)) is not None]
            big = max(cards, default=0)
            if svc.gpu_mem_mib > big:
                raise SpecError(
                    f"service {svc.name} asks for {svc.gpu_mem_mib} MiB of GPU memory per "
                    f"replica; the largest card it may use here has {big} MiB "
                    f"({', '.join(allowed)})"
                )
            milli = min(1000, -(-svc.gpu_mem_mib * 1000 // big))
        return ServiceTemplate(
            name=svc.name,
            team=svc.team,
            replica_rps=svc.replica_rps,
            slo_p99_ms=svc.slo_p99_ms,
            replica_gpu_milli=milli,
            min_replicas=svc.min_replicas,
            max_replicas=svc.max_replicas,
            gpu_models=frozenset({svc.gpu_model}) if svc.gpu_model else frozenset(),
            priority=svc.priority,
        )

    def load(self, row: ServiceRow) -> None:
        """The service (new, rescaled, or read at start) in the core and here."""
        self.scheduler.add_service(self.template(row))
        self.rows[row.name] = row

    def forget(self, name: str) -> None:
        """A deleted service: its row and its measurements go."""
        self.rows.pop(name, None)
        self.service_load.pop(name, None)

    def live(self, row: JobRow) -> str | None:
        """The live service a row is a replica of (None: a job of its own, or a replica
        whose service was deleted: it is cancelled once recovered)."""
        return row.service if row.service in self.rows else None

    def new_replica(self, service: str, seq: int, gpu_milli: int) -> str:
        """The core wants a replica: it becomes a job row (its id, the core's job id)."""
        svc = self.rows[service]
        job = NewJob(
            name=f"{service}-r{seq}",
            team=svc.team,
            kind="online-inference",
            priority=svc.priority,
            gpu_count=1,
            command=svc.command,
            env=svc.env,
            cwd=svc.cwd,
            gpu_model=svc.gpu_model,
            grace_s=svc.grace_s,
            max_retries=3,
            owner=svc.owner_token,
            gpu_milli=gpu_milli,
            service=service,
        )
        row, _ = self.store.jobs.submit(job, self.clock.now())
        return str(row.id)

    def measure(self, now: float) -> None:
        """Scrape targets are the running replicas; what they measured goes to the core:
        ServiceLoad (rate and p99 over the load window) and ServiceRate (the rate over a
        short window: the series the core's reactive and forecast rules read)."""
        if now - self.state.last_service_sample < self.config.scrape_s - 1e-9:
            return
        self.state.last_service_sample = now
        sched = self.config.scheduling
        window = sched.autoscale_load_window_s
        short = min(10.0, window)
        endpoints = self.state.endpoints
        targets: dict[str, Endpoint] = {}
        mine: dict[str, list[str]] = {}
        for name in self.scheduler.services:
            ids = [
                job_id
                for job_id, r in self.scheduler.replicas[name].items()
                if r.state is JobState.RUNNING and job_id in endpoints
            ]
            mine[name] = ids
            targets.update({job_id: endpoints[job_id] for job_id in ids})
        self.scraper.set_targets(targets)
        self.replica_load = {
            job_id: self.scraper.measure([job_id], now, short) for job_id in targets
        }
        for name, ids in mine.items():
            load = self.scraper.measure(ids, now)
            self.service_load[name] = load
            rate = self.scraper.measure(ids, now, short)
            self.scheduler.observe(ServiceRate(now, name, rate.rps))
            if load.reporting:
                self.scheduler.observe(
                    ServiceLoad(now, name, load.rps, load.p99_ms, load.reporting)
                )
