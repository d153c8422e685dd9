"""Parity with every feature on (scenarios/parity-all.yaml): sites and a cloud, team
guarantees with a night window, priority-quota, the online reserve and shared replicas,
cost- and locality-aware placement, two tariffs with price deferral and power caps,
thermal placement, burst, deadline jobs, sized jobs and an autoscaled service.

Leg A: the events the simulator fed the core, replayed into a fresh core, give the same
decision log, byte for byte, and the same commands: the core depends on its inputs only
(no side channel from the simulated world).

Leg B: `LiveService` on a real SQLite store and a manual clock, over an adapter that puts
the same simulated world behind its executor, telemetry, node probe and cloud commands
(gpupool.sim.scenario.fleet), gets the jobs through the store at their submit times and gives the
simulator's command stream; its event log holds an event for each command."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import pytest

from gpupool.domain.model import JobKind, JobSpec
from gpupool.errors import GpupoolError
from gpupool.ports.clock.fake import ManualClock
from gpupool.scheduler import (
    Burst,
    Cancel,
    Command,
    Defer,
    Launch,
    Reclaim,
    Scale,
    ServiceDemand,
    SetPowerCap,
    Stop,
    Wait,
)
from gpupool.scheduler.cycle.burst import burst_rules
from gpupool.server.fleet.sites import SitesConfig
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store
from gpupool.sim.eventsim import replay
from gpupool.sim.scenario.config import ScenarioConfig, load_scenario, parse_scenario
from gpupool.sim.scenario.fleet import SimulatedFleet
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.workload import Workload
from gpupool.sim.scenario.world import ScenarioSim
from gpupool.sizing.planner import PlanRequest
from gpupool.sizing.request_json import sizing_of

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "parity-all.yaml"


@pytest.fixture(scope="module")
def recorded() -> ScenarioSim:
    cfg = load_scenario(SCENARIO)
    sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None)))
    sim.recorded, sim.commands = [], []
    sim.run()
    return sim


def test_every_feature_acts_in_the_parity_scenario(recorded: ScenarioSim) -> None:
    kinds = Counter(type(c).__name__ for _, c in recorded.commands or [])
    for kind in (Launch, Stop, SetPowerCap, Burst, Reclaim, Defer):
        assert kinds[kind.__name__] > 0, f"no {kind.__name__} in {dict(kinds)}"
    assert any(isinstance(c, SetPowerCap) and c.is_reset for _, c in recorded.commands or [])
    notes = [d.action for d in recorded.engine.log.decisions]
    assert any(n.startswith("remote refused") for n in notes)
    assert any(r.service is not None for r in recorded.core.records.values())
    assert recorded.sized and all(j in recorded.core.records for j in recorded.sized)


def test_replayed_events_give_the_same_log_and_commands(recorded: ScenarioSim) -> None:
    assert recorded.recorded and recorded.commands
    fresh = recorded.new_core()
    commands = replay(fresh, recorded.recorded)
    names = tuple(n.name for n in recorded.cluster.nodes)
    assert fresh.log.render(names) == recorded.engine.log.render(names)
    assert commands == recorded.commands


def test_a_changed_input_changes_the_replay(recorded: ScenarioSim) -> None:
    """The comparison can fail: the service's demand doubled once gives other commands."""
    stream = list(recorded.recorded or [])
    k = next(k for k, e in enumerate(stream) if isinstance(e, ServiceDemand) and e.peak_rps > 0)
    demand = stream[k]
    assert isinstance(demand, ServiceDemand)
    stream[k] = dataclasses.replace(demand, peak_rps=demand.peak_rps * 4)
    fresh = recorded.new_core()
    try:
        commands = replay(fresh, stream)
    except GpupoolError:  # it decided differently, then could not follow the world's events
        return
    assert commands != recorded.commands


# ---- leg B: the live service over the same simulated world ----------------------------------
ONLINE = (
    # online jobs (the live service has no autoscaled services yet): users in us-east,
    # a 60 ms bound keeps them off west
    ("chat-a", 2.0, 6.0),
    ("chat-b", 7.5, 3.0),
)


def live_workload(
    cfg: ScenarioConfig, online: tuple[tuple[str, float, float], ...] = ONLINE
) -> Workload:
    """The parity scenario's jobs as the live API can state them: renamed to the ids the
    store assigns (1, 2, ... in arrival order), no CPU or memory requests, no services but
    `online` jobs in their place."""
    wl = build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None))
    jobs = list(wl.jobs) + [
        JobSpec(
            name,
            team="serving",
            kind=JobKind.ONLINE,
            priority=100,
            submit_s=at_h * 3600.0,
            duration_s=hours * 3600.0,
            user_region="us-east",
            latency_bound_ms=60.0,
        )
        for name, at_h, hours in online
    ]
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    ids = {j.job_id: str(k + 1) for k, j in enumerate(jobs)}
    renamed = tuple(
        dataclasses.replace(j, job_id=ids[j.job_id], cpu_milli=0, mem_mib=0) for j in jobs
    )
    return Workload(jobs=renamed, sized={ids[k]: v for k, v in wl.sized.items()})


def new_job(j: JobSpec, sized: PlanRequest | None) -> NewJob:
    assert len(j.gpu_models) <= 1 and j.gpu_milli == 1000
    return NewJob(
        name=f"job-{j.job_id}",
        team=j.team,
        kind=j.kind.value,
        priority=j.priority,
        gpu_count=j.gpu_count,
        command=("true",),
        gpu_model=next(iter(j.gpu_models), None),
        checkpoint_every_s=j.checkpoint_interval_s,
        duration_s=j.duration_s,
        dataset=j.dataset,
        dataset_gb=j.dataset_gb,
        deadline_at=j.deadline_s,
        user_region=j.user_region,
        latency_bound_ms=j.latency_bound_ms,
        state_gib_per_gpu=j.state_gib_per_gpu,
        sizing=sizing_of(sized) if sized is not None else None,
        topology=j.topology,
        topology_preferred=j.topology_preferred,
    )


Normal = tuple[object, ...]


def normal(t: float, c: Command) -> Normal:
    """What parity compares: the time and the decision, not the spec's wording."""
    if isinstance(c, Launch):
        where = tuple((s.node, g) for s in c.placement.shares for g in s.gpus)
        return (t, "launch", c.job_id, c.resume, where)
    if isinstance(c, Stop | Cancel):
        return (t, type(c).__name__.lower(), c.job_id, c.reason)
    if isinstance(c, SetPowerCap):
        return (t, "cap", c.node, c.gpu, c.power_limit_w, c.locked_sm_mhz)
    if isinstance(c, Burst | Reclaim):
        return (t, type(c).__name__.lower(), c.nodes)
    if isinstance(c, Scale):
        return (t, "scale", c.service, c.from_replicas, c.to_replicas, c.reason)
    if isinstance(c, Wait):
        return (t, "wait", c.job_id, c.code, c.reason)
    assert isinstance(c, Defer)
    return (t, "defer", c.job_id, c.until_s)


def run_live(cfg: ScenarioConfig, wl: Workload, tmp: Path) -> tuple[list[Normal], Store]:
    clock = ManualClock(0.0)
    fleet = SimulatedFleet(ScenarioSim(cfg, wl), clock)
    world = fleet.world
    store = Store(f"sqlite:///{tmp}/parity.db")
    store.migrate()
    sites = (
        None
        if world.topology is None
        else SitesConfig(
            topology=world.topology,  # type: ignore[arg-type]
            node_site={
                n: world.cluster.nodes[world.core.fleet.node_index[n]].cluster
                for n, _, _ in fleet.onprem_nodes()
            },
            placement=cfg.scheduling.placement.site,
            value_of_time_usd_per_h=cfg.scheduling.placement.value_of_time_usd_per_h,
            burst=burst_rules(cfg.scheduling.burst, len(world.cloud_nodes)),
            cloud_nodes=fleet.cloud_nodes(),
            start_command=("start", "{node}"),
            stop_command=("stop", "{node}"),
            check_s=cfg.scheduling.cycle_s,
            join_timeout_s=1e9,
        )
    )
    config = LiveConfig(
        tmp / "state",
        cfg.scheduling,
        sample_s=0.0,
        host=cfg.name,
        nodes=fleet.onprem_nodes(),
        node_labels=fleet.node_labels(),
        sites=sites,
        seed=cfg.seed,
    )
    service = LiveService(config, store, fleet, fleet, clock, probe=fleet.probe, cloud_runner=fleet)
    fleet.attach(service.scheduler)
    service.record.commands = []
    arrivals = sorted(wl.jobs, key=lambda j: (j.submit_s, j.job_id))
    nxt = 0
    for k in range(math.ceil(cfg.horizon_s / cfg.scheduling.cycle_s)):
        now = k * cfg.scheduling.cycle_s
        clock.t = now
        while nxt < len(arrivals) and arrivals[nxt].submit_s <= now:
            job = arrivals[nxt]
            row, _ = store.jobs.submit(new_job(job, wl.sized.get(job.job_id)), job.submit_s)
            assert str(row.id) == job.job_id
            nxt += 1
        service.step()
        for t in fleet.events_before(min(now + cfg.scheduling.cycle_s, cfg.horizon_s)):
            clock.t = t
            service.step()
    return [normal(t, c) for t, c in service.record.commands], store


@pytest.fixture(scope="module")
def legs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Normal], list[Normal], Store]:
    cfg = load_scenario(SCENARIO)
    wl = live_workload(cfg)
    sim = ScenarioSim(cfg, wl)
    sim.commands = []
    sim.run()
    simulated = [normal(t, c) for t, c in sim.commands]
    live, store = run_live(cfg, wl, tmp_path_factory.mktemp("live"))
    return simulated, live, store


@pytest.mark.slow  # long: started first (tests/conftest.py orders slow modules first)
def test_the_live_service_over_the_simulated_world_decides_as_the_simulator(
    legs: tuple[list[Normal], list[Normal], Store],
) -> None:
    simulated, live, _ = legs
    kinds = Counter(n[1] for n in simulated)
    for kind in ("launch", "stop", "cap", "burst", "reclaim", "defer", "wait"):
        assert kinds[kind] > 0, dict(kinds)
    for k, (a, b) in enumerate(zip(simulated, live, strict=False)):
        assert a == b, f"command {k} differs: simulator {a}, live {b}"
    assert len(live) == len(simulated)


def test_the_live_event_log_holds_an_event_per_command(
    legs: tuple[list[Normal], list[Normal], Store],
) -> None:
    _, live, store = legs
    events = Counter(e.kind for e in store.events.after(0, limit=1_000_000))
    commands = Counter(n[1] for n in live)
    launches = commands["launch"]
    assert events["running"] == launches
    assert events["preempting"] == commands["stop"]
    assert events["power-cap"] == commands["cap"]
    assert events["cloud-burst"] == sum(len(n[2]) for n in live if n[1] == "burst")  # type: ignore[arg-type]
    assert events["cloud-reclaim"] == sum(len(n[2]) for n in live if n[1] == "reclaim")  # type: ignore[arg-type]
    assert events["deferred"] == commands["defer"]


def test_the_live_service_gives_the_waiting_jobs_the_simulators_reasons(
    legs: tuple[list[Normal], list[Normal], Store],
) -> None:
    simulated, live, _ = legs
    waits = [n for n in simulated if n[1] == "wait"]
    assert waits == [n for n in live if n[1] == "wait"]
    codes = Counter(str(n[3]) for n in waits)
    assert {"Resources", "Priority", "Deferred", "Window", "WaitingForVictims"} <= set(codes)


RACKED = {
    "name": "racks-parity",
    "seed": 3,
    "horizon_h": 12,
    "cycle_s": 60,
    "policy": "priority-quota",
    "reservations": True,
    "online_reserve": 0.0,
    "topology": {"levels": ["rack"], "links": ["nvlink", "infiniband"]},
    "cluster": [{"gpu_type": "A100-80GB", "nodes": 8, "gpus_per_node": 8, "domains": {"rack": 4}}],
    "teams": [
        {"name": "research", "guaranteed": {"A100-80GB": 48}},
        {"name": "product", "guaranteed": {"A100-80GB": 16}},
    ],
    "workload": [
        {"generator": "backlog", "name": "gang", "team": "research", "count": 10,
         "spread_h": 8, "gpu_choices": [16, 32], "gpu_weights": [0.5, 0.5],
         "work_h_min": 1, "work_h_max": 4, "topology": "rack"},
        {"generator": "backlog", "name": "pref", "team": "research", "count": 8,
         "spread_h": 8, "gpu_choices": [16, 24], "gpu_weights": [0.5, 0.5],
         "work_h_min": 1, "work_h_max": 3, "topology_preferred": "rack"},
        {"generator": "backlog", "name": "narrow", "team": "product", "count": 30,
         "spread_h": 10, "gpu_choices": [1, 2, 4, 8], "gpu_weights": [0.25, 0.25, 0.25, 0.25],
         "work_h_min": 0.5, "work_h_max": 3},
    ],
}  # fmt: skip
"""Two racks of four 8-GPU nodes: gangs that require a rack, gangs that prefer one, and
narrow jobs, with reservations (a gang's reservation stays inside one rack)."""


def test_the_live_service_keeps_gangs_in_their_racks_as_the_simulator(tmp_path: Path) -> None:
    """The same racks, the same gangs: the live service launches each where the simulator
    does (every gang that requires a rack inside one) and gives the same waits."""
    cfg = parse_scenario(RACKED)
    wl = live_workload(cfg, online=())
    sim = ScenarioSim(cfg, wl)
    sim.commands = []
    sim.run()
    simulated = [normal(t, c) for t, c in sim.commands]
    live, _ = run_live(cfg, wl, tmp_path)
    assert live == simulated
    required = {j.job_id for j in wl.jobs if j.topology == "rack"}
    rack_of = [n.label("rack") for n in sim.cluster.nodes]
    gangs = [n for n in live if n[1] == "launch" and n[2] in required]
    assert len(gangs) >= 5, len(gangs)
    for launch in gangs:
        racks = {rack_of[node] for node, _ in launch[4]}  # type: ignore[union-attr]
        assert len(racks) == 1, launch
    reasons = [str(n[4]) for n in live if n[1] == "wait" and n[2] in required]
    assert any("inside one rack" in r for r in reasons), reasons[:3]
