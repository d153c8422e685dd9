"""Live multi-cluster without Ray: the sites file, the core's pools per site with the
simulator's chooser, cloud nodes started and stopped by the burst controller, and the
live service carrying it out (fake executor, fake node list, manual clock)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.errors import SpecError
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import Burst, Command, Launch, NodeUp, Reclaim, Scheduler, Stop, Wait
from gpupool.scheduler.config import PlacementConfig, SchedulerConfig
from gpupool.server.fleet.sites import CloudNodes, SitesConfig, pool_prices, read_sites
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store
from sites_config import CLOUD, FAST, FED, Runner, sites


# ---- the file ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nodes": {}}, "federation: missing"),
        (sites(colour="red"), "unknown key(s) colour"),
        ({"federation": FED, "nodes": {"e1": "north"}}, "nodes.e1: unknown site 'north'"),
        (sites(placement="random"), "placement: expected one of"),
        (
            sites(
                cloud={
                    **CLOUD,
                    "nodes": [{"name": "x", "site": "east", "model": "H100", "gpus": 4}],
                }
            ),
            "east is not a cloud site",
        ),
        (sites(cloud={"start": "s", "nodes": CLOUD["nodes"]}), "need both a start and a stop"),
        (
            sites(
                cloud={
                    **CLOUD,
                    "nodes": [{"name": "c1", "site": "cloud", "model": "H100", "gpus": 0}],
                }
            ),
            "gpus: expected a whole number >= 1",
        ),
        (sites(burst={"util_threshold": 2.0}), "burst"),
        (sites(burst={"sustain": 3}), "unknown key(s) sustain"),
    ],
)
def test_a_bad_sites_file_says_where(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=r"sites\.yaml") as err:
        read_sites(raw, "sites.yaml")
    assert message in str(err.value)


def test_a_sites_file_reads_commands_and_rules() -> None:
    cfg = read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml")
    assert cfg.start_command == ("start-node", "{node}", "{model}", "{gpus}", "{site}")
    assert cfg.stop_command == ("stop-node", "{node}")
    assert cfg.burst.max_cloud_nodes == 1 and cfg.burst.sustain_s == 10
    assert cfg.site_of("c1") == "cloud" and cfg.site_of("e1") == "east"
    assert cfg.site_of("x9", "west") == "west" and cfg.site_of("x9") is None


# ---- the core: pools per site, the simulator's chooser --------------------------------------
def two_sites() -> Cluster:
    return Cluster(
        "fed",
        (
            Node("e1", "A100-80GB", 4, 1_000_000, 1 << 30, cluster="east"),
            Node("w1", "A100-80GB", 4, 1_000_000, 1 << 30, cluster="west"),
        ),
    )


def job(job_id: str, gpus: int, t: float, **kw: Any) -> JobSpec:
    return JobSpec(job_id, gpu_count=gpus, team="ml", submit_s=t, duration_s=3600.0, **kw)


def config(**kw: Any) -> SchedulerConfig:
    """The service's defaults (1 s cycle, no reserve, 60 s minimum runtime) and `kw`."""
    base: dict[str, Any] = {
        "policy": "fifo",
        "cycle_s": 1.0,
        "online_reserve": 0.0,
        "preemption": PreemptionRules(60.0, 3),
    }
    return SchedulerConfig(**(base | kw))


def fed_scheduler(cfg: SitesConfig | None = None, cluster: Cluster | None = None) -> Scheduler:
    cfg = cfg or read_sites(sites(), "sites.yaml")
    cluster = cluster or two_sites()
    pools = {f"{n.cluster}/{n.gpu_model}": (n.cluster, n.gpu_model) for n in cluster.nodes}
    return Scheduler(
        cluster,
        config(placement=PlacementConfig(site=cfg.placement), burst=cfg.burst),
        topology=cfg.topology,
        pool_price=pool_prices(cfg, pools),
        cloud_nodes=[c.name for c in cfg.cloud_nodes],
    )


def placed(decisions: Sequence[Command], s: Scheduler) -> dict[str, str]:
    return {
        d.job_id: s.cluster.nodes[d.placement.shares[0].node].name
        for d in decisions
        if isinstance(d, Launch)
    }


def test_pools_are_per_site_and_work_follows_free_capacity() -> None:
    s = fed_scheduler()
    assert sorted(s.fleet.pool_nodes) == ["east/A100-80GB", "west/A100-80GB"]
    s.submit(job("1", 4, 0.0), 0.0)
    first = placed(s.cycle(0.0), s)
    s.submit(job("2", 4, 1.0), 1.0)
    second = placed(s.cycle(1.0), s)
    # whichever site the first took, the second goes to the other: no waiting
    assert {first["1"], second["2"]} == {"e1", "w1"}


def test_work_goes_where_it_finishes_first_unless_its_data_would_take_longer() -> None:
    s = fed_scheduler()
    for k, t in (("a", 0.0), ("b", 1.0), ("c", 2.0), ("d", 3.0)):
        s.submit(job(k, 4, t), t)
        s.cycle(t)
    # a and b fill both sites; c and d wait, one at each (the shorter queue)
    assert {s.records["a"].gpu_type, s.records["b"].gpu_type} == set(s.fleet.pool_nodes)
    assert {s.records["c"].gpu_type, s.records["d"].gpu_type} == set(s.fleet.pool_nodes)
    # 1.35 TB over the 1 Gbps link takes 3 h to move: each waits where its data is
    for site in ("east", "west"):
        name = f"far-{site}"
        s.submit(job(name, 1, 4.0, dataset=f"corpus-{site}", dataset_gb=1350.0), 4.0)
        s.cycle(4.0)
        assert s.records[name].gpu_type == f"{site}/A100-80GB"
        notes = [d.action for d in s.log.decisions if d.job_id == name]
        assert any(n.startswith(f"pool {site}/A100-80GB: ") for n in notes), notes


def test_a_claimant_whose_victim_ends_by_itself_is_launched() -> None:
    """The victim exits on its own during its grace period: the claimant must come out
    of the next cycle as a Launch (it used to be started in the core but never launched)."""
    cluster = Cluster("c", (Node("n", "A100-80GB", 1, 1_000_000, 1 << 30, cluster="c"),))
    teams = (TeamQuota("serving", {"A100-80GB": 1}, {}), TeamQuota("research", {}, {}))
    s = Scheduler(
        cluster, config(teams=teams, policy="priority-quota", preemption=PreemptionRules(0.0, 3))
    )
    s.submit(JobSpec("train", team="research", kind=JobKind.TRAINING), 0.0)
    assert [type(d) for d in s.cycle(0.0)] == [Launch]
    s.submit(JobSpec("chat", team="serving", kind=JobKind.ONLINE, priority=100), 1.0)
    assert [type(d) for d in s.cycle(1.0) if not isinstance(d, Wait)] == [Stop]
    s.finished("train", 2.0, JobState.FINISHED)  # exit 0 before it saw SIGTERM
    out = s.cycle(2.0)
    assert [(type(d), d.job_id) for d in out] == [(Launch, "chat")]
    assert s.records["chat"].state is JobState.RUNNING


# ---- cloud nodes --------------------------------------------------------------------------------
def test_the_core_bursts_after_the_sustain_window_and_reclaims_when_idle() -> None:
    cfg = read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml")
    cluster = Cluster(
        "fed",
        (
            Node("e1", "A100-80GB", 4, 1_000_000, 1 << 30, cluster="east"),
            Node("c1", "H100", 4, 1_000_000, 1 << 30, cluster="cloud"),
        ),
    )
    s = fed_scheduler(cfg, cluster)
    s.submit(job("a", 4, 0.0, gpu_models=frozenset({"A100-80GB"})), 0.0)
    s.submit(job("b", 4, 0.0), 0.0)  # any GPU: waits while c1 is down

    def clouds(t: float) -> list[Command]:
        return [c for c in s.cycle(t) if isinstance(c, Burst | Reclaim)]

    assert clouds(0.0) == [] and clouds(9.0) == []  # 9 s < the 10 s sustain window
    burst = clouds(10.0)
    assert [(type(c), c.nodes) for c in burst] == [(Burst, ("c1",))]
    assert "pending" in burst[0].reason
    assert clouds(11.0) == []  # no second burst while it starts
    assert "b" not in s.placements()
    s.observe(NodeUp(20.0, "c1"))
    launches = [c for c in s.cycle(20.0) if isinstance(c, Launch)]
    assert [(c.job_id, s.cluster.nodes[c.placement.nodes[0]].name) for c in launches] == [
        ("b", "c1")
    ]
    s.finished("b", 21.0, JobState.FINISHED)
    assert clouds(21.0) == []  # idle: the reclaim window opens
    reclaim = clouds(45.0)
    assert [(type(c), c.nodes) for c in reclaim] == [(Reclaim, ("c1",))]
    assert "cloud utilisation 0% < 30%" in reclaim[0].reason
    assert not s.fleet.pool_nodes["cloud/H100"].any()  # out of the pool while it stops


def test_cloud_nodes_run_the_commands_the_core_decides(tmp_path: Path) -> None:
    cfg = read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml")
    runner = Runner()
    cloud = CloudNodes(cfg, tmp_path, runner)
    assert cloud.start("c1", "3 GPUs pending", 10.0).startswith("start c1: 3 GPUs pending; ran ")
    assert runner.calls == [["start-node", "c1", "H100", "4", "cloud"]]
    assert cloud.state("c1") == "starting"
    assert cloud.joined("c1", 20.0) == "cloud node c1 joined 10 s after its start"
    assert cloud.stop("c1", "idle", 50.0) == "stop c1: idle; ran stop-node c1"
    assert runner.calls[-1] == ["stop-node", "c1"]
    assert cloud.left("c1", 55.0) == "cloud node c1 stopped (reclaimed)"


def test_a_cloud_node_that_never_joins_is_given_up(tmp_path: Path) -> None:
    cfg = read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml")
    runner = Runner(code=3)
    cloud = CloudNodes(cfg, tmp_path, runner)
    cloud.start("c1", "pending", 10.0)
    kinds = [k for k, _, _ in cloud.check(11.0)]
    assert kinds == ["cloud-error"]  # the start command failed (exit 3)
    events = cloud.check(75.0)
    assert [(k, out) for k, _, out in events if "did not join" in _] == [("cloud-error", ("c1",))]
    assert any("did not join within 60 s" in m for _, m, _ in events)
    assert cloud.state("c1") == "stopping"


# ---- the live service ---------------------------------------------------------------------------
def test_the_live_service_bursts_runs_work_on_the_cloud_and_reclaims(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    cfg = read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml")
    alive = {"e1": "id-e1", "w1": "id-w1"}
    runner = Runner()
    executor = FakeExecutor()
    service = LiveService(
        LiveConfig(
            tmp_path / "state",
            sample_s=0.0,
            host="fed",
            nodes=(("e1", "A100-80GB", 4), ("w1", "A100-80GB", 4)),
            sites=cfg,
        ),
        store,
        executor,
        FakeTelemetry("4xA100-80GB,4xA100-80GB,4xH100"),
        clock,
        probe=lambda: dict(alive),
        cloud_runner=runner,
    )
    assert [n.cluster for n in service.cluster.nodes] == ["east", "west", "cloud"]

    def submit(name: str) -> int:
        row, _ = store.jobs.submit(
            NewJob(name, "ml", "training", 0, 4, ("true",), duration_s=3600.0), clock.now()
        )
        return row.id

    def step_to(t: float) -> None:
        while clock.now() < t:
            clock.advance(1.0)
            service.step()

    jobs = [submit(f"j{k}") for k in range(3)]
    step_to(1001.0)
    nodes = {store.jobs.get(j).node for j in jobs}
    assert nodes == {"e1", "w1", None}  # two run, one waits: c1 is down
    waiting = next(j for j in jobs if store.jobs.get(j).node is None)
    step_to(1015.0)
    assert runner.calls == [["start-node", "c1", "H100", "4", "cloud"]]
    alive["c1"] = "id-c1"  # the node joins
    step_to(1017.0)
    assert store.jobs.get(waiting).node == "c1" and store.jobs.get(waiting).state == "running"
    executor.finish(str(waiting))
    step_to(1060.0)
    kinds = [e.kind for e in store.events.after(0, limit=1000)]
    assert "cloud-reclaim" in kinds and runner.calls[-1] == ["stop-node", "c1"]
    del alive["c1"]
    step_to(1062.0)
    events = {e.kind: e.message for e in store.events.after(0, limit=1000)}
    assert events["cloud-node-down"] == "cloud node c1 stopped (reclaimed)"
    assert "node-lost" not in events
    assert "on-prem utilisation" in events["cloud-burst"] or "pending" in events["cloud-burst"]


def test_a_live_job_runs_where_its_data_is(tmp_path: Path) -> None:
    """The job's dataset travels from the API's row to the core's chooser: with both
    sites free, 1.35 TB in us-west sends it to w1 (east would first move it for 3 h)."""
    clock = ManualClock(500.0)
    service, store = two_site_service(tmp_path, clock)
    rows = [
        store.jobs.submit(
            NewJob(
                f"far-{site}",
                "ml",
                "training",
                0,
                1,
                ("true",),
                duration_s=600.0,
                dataset=f"corpus-{site}",
                dataset_gb=1350.0,
            ),
            clock.now(),
        )[0]
        for site in ("west", "east", "west")
    ]
    service.step()
    assert [store.jobs.get(r.id).node for r in rows] == ["w1", "e1", "w1"]


def test_the_sites_file_in_docs_ray_md_is_valid() -> None:
    import yaml

    text = (Path(__file__).resolve().parents[3] / "docs" / "ray.md").read_text()
    block = text.split("## Several clusters", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = read_sites(yaml.safe_load(block), "docs/ray.md")
    assert [c.name for c in cfg.cloud_nodes] == ["c1"]
    assert cfg.start_command[:4] == ("python", "-m", "gpupool.server.fleet.cloud_node", "start")
    assert "{state_dir}" in cfg.stop_command
    assert cfg.node_site == {"a1": "east", "a2": "east", "w1": "west"}


def test_a_cap_on_starts_per_cycle_spreads_them_over_cycles() -> None:
    cluster = Cluster("c", (Node("n", "A100-80GB", 8, 1_000_000, 1 << 30, cluster="c"),))
    s = Scheduler(cluster, config(max_starts_per_cycle=3))
    for k in range(7):
        s.submit(JobSpec(str(k), team="ml"), 0.0)
    counts = [sum(isinstance(c, Launch) for c in s.cycle(float(t))) for t in range(4)]
    assert counts == [3, 3, 1, 0]
    assert sorted(s.placements()) == [str(k) for k in range(7)]


def test_a_launch_the_executor_could_not_make_in_time_is_requeued(tmp_path: Path) -> None:
    from gpupool.errors import Unavailable

    class SlowOnce(FakeExecutor):
        def __init__(self) -> None:
            super().__init__()
            self.refused = 0

        def launch(self, spec: Any, now_s: float) -> Any:
            if self.refused == 0:
                self.refused += 1
                raise Unavailable(f"job {spec.job_id}: the node did not start it in time")
            return super().launch(spec, now_s)

    clock = ManualClock(10.0)
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    executor = SlowOnce()
    service = LiveService(
        LiveConfig(tmp_path / "state", sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry("2xA100-80GB"),
        clock,
    )
    row, _ = store.jobs.submit(NewJob("j", "ml", "training", 0, 1, ("true",)), clock.now())
    service.step()
    assert store.jobs.get(row.id).state == "suspended"
    assert "could not start yet" in store.jobs.get(row.id).reason
    clock.advance(1.0)
    service.step()
    assert store.jobs.get(row.id).state == "running" and store.jobs.get(row.id).attempts == 2


def test_an_online_job_no_site_can_serve_in_time_fails_with_the_reason(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    service, store = two_site_service(tmp_path, clock)
    row, _ = store.jobs.submit(
        NewJob(
            "chat",
            "serving",
            "online-inference",
            100,
            1,
            ("true",),
            user_region="us-west",
            latency_bound_ms=0.5,  # below even the latency inside a region
        ),
        clock.now(),
    )
    service.step()
    failed = store.jobs.get(row.id)
    assert failed.state == "failed" and "latency" in failed.reason, failed.reason


def two_site_service(tmp_path: Path, clock: ManualClock) -> tuple[LiveService, Store]:
    """The live service on e1 (east) and w1 (west), no cloud, fake executor."""
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    service = LiveService(
        LiveConfig(
            tmp_path / "state",
            sample_s=0.0,
            host="fed",
            nodes=(("e1", "A100-80GB", 4), ("w1", "A100-80GB", 4)),
            sites=read_sites(sites(), "sites.yaml"),
        ),
        store,
        FakeExecutor(),
        FakeTelemetry("4xA100-80GB,4xA100-80GB"),
        clock,
    )
    return service, store
