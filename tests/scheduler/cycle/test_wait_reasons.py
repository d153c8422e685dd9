"""Why a waiting job does not start: each reason code, decided by the core from its state
after a cycle (events with times in, Wait commands out), told only when it changes."""

from __future__ import annotations

from pathlib import Path

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import QuotaWindow, TeamQuota
from gpupool.energy.tariff import load_tariff, on_wall_clock
from gpupool.policies.preemption import PreemptionRules
from gpupool.scheduler import (
    Drain,
    Finished,
    Hold,
    Launch,
    NodeDown,
    NodeUp,
    Release,
    Scheduler,
    SchedulerConfig,
    Stop,
    Submitted,
    Wait,
)
from gpupool.scheduler.config import EnergyConfig, TeamLimits
from gpupool.scheduler.cycle.wait_reasons import REFRESH_S, reason_code, split_reason
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.summary import scenario_summary
from gpupool.sim.scenario.world import ScenarioSim

HOUR = 3600.0


def _core(gpus: int = 4, nodes: int = 1, **kw: object) -> Scheduler:
    fleet = tuple(Node(f"n{k}", "A100", gpus, 1_000_000, 1 << 30) for k in range(nodes))
    options: dict[str, object] = {
        "policy": "fifo",
        "cycle_s": 60.0,
        "online_reserve": 0.0,
        "preemption": PreemptionRules(0.0, 3),
    }
    options.update(kw)
    tariffs = options.pop("tariffs", None)
    return Scheduler(
        Cluster("c", fleet),
        SchedulerConfig(**options),  # type: ignore[arg-type]
        tariffs=tariffs,  # type: ignore[arg-type]
    )


def _job(job_id: str, gpus: int = 1, team: str = "a", **kw: object) -> JobSpec:
    return JobSpec(job_id, gpu_count=gpus, team=team, **kw)  # type: ignore[arg-type]


def _waits(out: list[object]) -> dict[str, tuple[str, str]]:
    return {c.job_id: (c.code, c.reason) for c in out if isinstance(c, Wait)}


def _launched(out: list[object]) -> list[str]:
    return [c.job_id for c in out if isinstance(c, Launch)]


def test_a_job_bigger_than_any_free_block_waits_for_resources_with_the_numbers() -> None:
    core = _core(gpus=4, nodes=2)
    core.observe(Submitted(0.0, _job("big0", 3)))
    core.observe(Submitted(0.0, _job("big1", 3)))
    core.observe(Submitted(0.0, _job("wide", 4)))
    out = core.cycle(0.0)
    assert sorted(_launched(out)) == ["big0", "big1"]
    assert _waits(out) == {
        "wide": (
            "Resources",
            "needs 4 A100 GPUs on one node, largest free block 1 (2 free in the pool)",
        )
    }


def test_a_job_behind_a_higher_priority_one_waits_with_priority() -> None:
    core = _core(gpus=4, policy="priority-quota")
    core.observe(Submitted(0.0, _job("run", 3)))
    core.cycle(0.0)
    core.observe(Submitted(1.0, _job("small", 2, priority=0, submit_s=1.0)))
    core.observe(Submitted(2.0, _job("urgent", 2, priority=10, submit_s=2.0)))
    out = core.cycle(60.0)
    assert _launched(out) == []
    waits = _waits(out)
    assert waits["urgent"][0] == "Resources"
    assert "largest free block 1" in waits["urgent"][1]
    assert waits["small"] == (
        "Priority",
        "behind 1 waiting job for the A100 pool with higher priority or waiting longer "
        "(first: urgent)",
    )


def test_a_team_at_its_maximum_waits_with_quota_max() -> None:
    quota = TeamQuota("a", guaranteed={"A100": 0}, maximum={"A100": 2})
    core = _core(gpus=4, policy="priority-quota", teams=(quota,))
    for k in range(3):
        core.observe(Submitted(0.0, _job(f"a{k}")))
    out = core.cycle(0.0)
    assert sorted(_launched(out)) == ["a0", "a1"]
    assert _waits(out) == {
        "a2": ("QuotaMax", "team a holds 2 of its maximum of 2 A100 GPUs; this job needs 1")
    }


def test_a_time_window_that_caps_the_team_is_the_reason() -> None:
    night = QuotaWindow(0.0, 12 * HOUR, guaranteed_share={}, max_share={"a": 0.25})
    quota = TeamQuota("a", guaranteed={"A100": 0}, maximum={"A100": 4})
    core = _core(gpus=4, policy="priority-quota", teams=(quota,), windows=(night,))
    core.observe(Submitted(0.0, _job("a0")))
    core.observe(Submitted(0.0, _job("a1")))
    out = core.cycle(0.0)
    assert _launched(out) == ["a0"]
    code, sentence = _waits(out)["a1"]
    assert code == "Window"
    assert sentence.startswith("the 00:00 UTC-12:00 UTC time window caps it: team a holds 1")


def test_a_borrowing_job_that_would_take_the_online_reserve_waits_with_reserve() -> None:
    core = _core(gpus=4, policy="priority-quota", online_reserve=0.5)  # 2 GPUs kept
    # slow to checkpoint (400 GiB a GPU): it could not vacate the reserve within a cycle
    core.observe(Submitted(0.0, _job("train", 3, state_gib_per_gpu=400.0)))
    out = core.cycle(0.0)
    assert _launched(out) == []
    code, sentence = _waits(out)["train"]
    assert code == "Reserve"
    assert "2 A100 GPUs kept for online inference" in sentence


def test_a_claimant_waits_for_its_victims_with_their_checkpoint_eta() -> None:
    owner = TeamQuota("a", guaranteed={"A100": 4}, maximum={"A100": 4})
    core = _core(gpus=4, policy="priority-quota", teams=(owner,))
    for k in range(4):
        core.observe(Submitted(0.0, _job(f"b{k}", team="b", state_gib_per_gpu=200.0)))
    assert len(_launched(core.cycle(0.0))) == 4
    core.observe(Submitted(100.0, _job("mine", 2, team="a")))
    out = core.cycle(120.0)
    stopped = sorted(c.job_id for c in out if isinstance(c, Stop))
    assert len(stopped) == 2
    code, sentence = _waits(out)["mine"]
    assert code == "WaitingForVictims"
    eta = max(core.records[v].vacate_at or 0.0 for v in stopped)
    assert eta > 120.0
    assert sentence.startswith(f"2 preempted jobs ({', '.join(stopped)}) are writing checkpoints")
    assert sentence.endswith(f"expected by 00:{int(eta // 60):02d} UTC")


def test_a_deadline_job_held_for_a_cheap_hour_waits_deferred() -> None:
    tariff = on_wall_clock(load_tariff("guangdong-tou"))
    core = _core(
        gpus=4,
        energy=EnergyConfig(tariff="guangdong-tou", price_aware=True, deferral_slot_s=900.0),
        tariffs={"default": tariff},
    )
    now = 22 * HOUR
    core.observe(Submitted(now, _job("late", duration_s=HOUR, deadline_s=28 * HOUR, submit_s=now)))
    out = core.cycle(now)
    assert _launched(out) == []
    code, sentence = _waits(out)["late"]
    assert code == "Deferred"
    assert sentence.startswith("price: held for cheaper power until 00:00 UTC")


def test_a_team_at_its_running_limit_waits_with_job_limit() -> None:
    core = _core(gpus=8, team_limits={"a": TeamLimits(max_running_jobs=1)})
    core.observe(Submitted(0.0, _job("a0")))
    core.observe(Submitted(0.0, _job("a1")))
    out = core.cycle(0.0)
    assert _waits(out) == {"a1": ("JobLimit", "team a at its limit of 1 running jobs")}


def test_a_held_job_is_held_and_is_not_told_again() -> None:
    core = _core(gpus=1)
    core.observe(Submitted(0.0, _job("run")))
    core.observe(Submitted(1.0, _job("h", submit_s=1.0)))
    out = core.cycle(1.0)
    assert _waits(out)["h"][0] == "Resources"
    core.observe(Hold(2.0, "h"))
    out = core.cycle(60.0)
    assert "h" not in _waits(out)  # the hold says why; the driver shows it
    assert core.explain_waits(60.0)["h"].code == "Held"
    core.observe(Release(61.0, "h"))
    assert _waits(core.cycle(120.0))["h"][0] == "Resources"  # told again once it waits


def test_a_job_that_fits_but_was_not_started_yet_is_scheduling() -> None:
    core = _core(gpus=4, max_starts_per_cycle=1)
    core.observe(Submitted(0.0, _job("x")))
    core.observe(Submitted(0.0, _job("y")))
    out = core.cycle(0.0)
    assert _launched(out) == ["x"]
    assert _waits(out) == {
        "y": ("Scheduling", "it fits the free GPUs now; it is considered again at the next cycle")
    }


def test_reasons_are_told_once_and_moved_numbers_at_most_once_a_refresh() -> None:
    core = _core(gpus=1, cycle_s=10.0)
    core.observe(Submitted(0.0, _job("run", duration_s=10 * HOUR)))
    for k in range(300):
        core.observe(Submitted(0.0, _job(f"w{k:03d}")))
    out = core.cycle(0.0)
    assert len(_waits(out)) == 300
    assert _waits(core.cycle(10.0)) == {}  # nothing changed: nothing told
    # the head leaves: w000 runs, everyone else moves up one place
    core.observe(Finished(15.0, "run"))
    out = core.cycle(20.0)
    assert _launched(out) == ["w000"]
    waits = _waits(out)
    # w001 became the head (a new code); the others' numbers moved, under a refresh
    assert list(waits) == ["w001"] and waits["w001"][0] == "Resources"
    assert _waits(core.cycle(REFRESH_S - 10.0)) == {}
    later = _waits(core.cycle(REFRESH_S))
    assert sorted(later) == [f"w{k:03d}" for k in range(2, 33)]  # the front: 32 jobs deep
    assert waits_of_deep(core) == "behind at least 32 waiting jobs for the A100 pool"
    assert later["w002"] == (
        "Priority",
        "behind 1 waiting job for the A100 pool with higher priority or waiting longer "
        "(first: w001)",
    )


def waits_of_deep(core: Scheduler) -> str:
    sentence = core.wait_reasons.told["w299"][1]
    return sentence.split(" with higher")[0]


def test_the_same_events_give_the_same_reasons() -> None:
    def run() -> list[Wait]:
        core = _core(gpus=4, nodes=2, policy="backfill")
        waits: list[Wait] = []
        for k in range(40):
            t = float(k * 30)
            core.observe(Submitted(t, _job(f"j{k}", 1 + k % 4, priority=k % 3, submit_s=t)))
            done = f"j{k - 5}"
            if k >= 5 and k % 2 == 0 and core.records[done].state is JobState.RUNNING:
                core.observe(Finished(t, done))
            waits += [c for c in core.cycle(t) if isinstance(c, Wait)]
        return waits

    first = run()
    assert first and first == run()
    assert {w.code for w in first} >= {"Resources", "Priority"}


def test_stored_reasons_split_into_code_and_sentence() -> None:
    assert split_reason("Resources: needs 4 A100 GPUs") == ("Resources", "needs 4 A100 GPUs")
    assert split_reason("preempted: x; resumes") == ("", "preempted: x; resumes")
    assert split_reason("Nonsense: x") == ("", "Nonsense: x")
    assert split_reason("deferred until 00:00 (price)")[0] == "Deferred"
    assert reason_code("held by alice", waiting=True, held=True) == "Held"
    assert reason_code("Priority: behind 2", waiting=False, held=False) == ""
    assert reason_code("Unplaceable: cannot run here", waiting=False, held=False) == "Unplaceable"
    assert JobKind.ONLINE  # the kinds module is the one the core uses


def test_a_job_wider_than_a_node_waits_for_idle_whole_nodes() -> None:
    core = _core(gpus=4, nodes=3)
    core.observe(Submitted(0.0, _job("one", 1)))
    core.observe(Submitted(0.0, _job("two", 1)))
    assert sorted(_launched(core.cycle(0.0))) == ["one", "two"]  # packed on one node
    core.observe(Submitted(1.0, _job("wide", 11, submit_s=1.0)))
    out = core.cycle(60.0)
    assert _launched(out) == []
    assert _waits(out) == {
        "wide": (
            "Resources",
            "needs 11 A100 GPUs across nodes: 2 idle 4-GPU nodes and 3 on one more node; "
            "2 nodes are idle (10 GPUs free in the pool)",
        )
    }


LIMITED = """
name: limited
seed: 3
horizon_h: 24
cycle_s: 60
policy: priority-quota
cluster:
  - {gpu_type: A100-80GB, nodes: 2, gpus_per_node: 8}
online_reserve: 0
teams:
  - {name: training, max_running_jobs: 3}
  - {name: other}
workload:
  - {generator: backlog, name: train, team: training, count: 20, submit_h: 0, spread_h: 4,
     gpu_choices: [1, 2], gpu_weights: [0.5, 0.5], work_h_min: 2, work_h_max: 6}
  - {generator: backlog, name: more, team: other, count: 30, submit_h: 0, spread_h: 4,
     gpu_choices: [2, 4, 8], gpu_weights: [0.4, 0.4, 0.2], work_h_min: 2, work_h_max: 6}
"""


def test_the_scenario_report_counts_the_jobs_that_waited_with_each_reason(
    tmp_path: Path,
) -> None:
    path = tmp_path / "limited.yaml"
    path.write_text(LIMITED, encoding="utf-8")
    cfg = load_scenario(path)
    sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None)))
    sim.commands = []
    sim.run()
    waited = scenario_summary(sim, 0.0)["waited_with"]
    told: dict[str, set[str]] = {}
    for _, c in sim.commands:
        if isinstance(c, Wait):
            told.setdefault(c.code, set()).add(c.job_id)
    assert waited == {code: len(ids) for code, ids in sorted(told.items())}
    assert {"JobLimit", "Resources", "Priority"} <= set(waited)
    team_of = {r.job_id: r.spec.team for r in sim.core.records.values()}
    assert {team_of[j] for j in told["JobLimit"]} == {"training"}


def test_a_job_whose_pool_is_down_says_which_node_and_why() -> None:
    core = _core(gpus=2, nodes=2)
    core.observe(NodeDown(0.0, "n0", "node n0 unhealthy: GPU 1 uncorrected ECC errors"))
    core.observe(Drain(0.0, "n1"))
    core.observe(Submitted(0.0, _job("j")))
    assert _waits(core.cycle(0.0)) == {
        "j": (
            "Resources",
            "needs 1 A100 GPU; only 0 are up and not drained "
            "(node n0 unhealthy: GPU 1 uncorrected ECC errors; node n1 drained)",
        )
    }
    core.observe(NodeUp(1.0, "n0"))
    assert _launched(core.cycle(60.0)) == ["j"]
