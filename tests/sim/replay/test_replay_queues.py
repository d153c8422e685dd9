"""The rule baselines and the learned queue of the trace replay, against hand-worked cases."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpupool.cli.main import main
from gpupool.domain.model import JobSpec
from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import GuardConfig
from gpupool.learning.ordering import LasQueues
from gpupool.sim.replay import ordered as ordered_replay
from gpupool.sim.replay.common import ReplayResult
from gpupool.sim.replay.run import run_replay


def j(name: str, gpus: int, submit: float, duration: float, team: str = "default") -> JobSpec:
    return JobSpec(name, gpu_count=gpus, submit_s=submit, duration_s=duration, team=team)


def starts(r: ReplayResult) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for d in r.log.decisions:
        if d.action == "start":
            out.setdefault(d.job_id, []).append(d.time_s)
    return out


def jct(r: ReplayResult, trace: list[JobSpec]) -> dict[str, float]:
    submit = {x.job_id: x.submit_s for x in trace}
    return {d.job_id: d.time_s - submit[d.job_id] for d in r.log.decisions if d.action == "finish"}


def actions(r: ReplayResult) -> list[tuple[float, str, str]]:
    """What happened to jobs (the guard's notes left out)."""
    return [(d.time_s, d.action, d.job_id) for d in r.log.decisions if d.job_id != "learning"]


LAS_800 = LearningConfig(las=LasQueues((800.0,)))


def test_las_preempts_a_job_that_crossed_a_threshold_for_a_new_arrival() -> None:
    # one 8-GPU node; long reaches 800 GPU-s at t=100 and drops to the second queue, so
    # new (arriving at 150 with nothing attained, first queue) preempts it at once.
    trace = [j("long", 8, 0, 1000), j("new", 8, 150, 50)]
    r = run_replay(trace, 1, 8, "las", learning=LAS_800)
    assert actions(r) == [
        (0, "start", "long"),
        (150, "preempt", "long"),
        (150, "start", "new"),
        (200, "finish", "new"),
        (200, "start", "long"),
        (1050, "finish", "long"),
    ]
    assert r.metrics.preemptions == 1


def test_las_is_first_come_first_served_inside_a_queue_until_the_threshold() -> None:
    # new arrives at 50 while long (400 GPU-s) is still in the first queue: it waits, and
    # runs the moment long crosses 800 GPU-s (t=100): the crossing is an event.
    trace = [j("long", 8, 0, 1000), j("new", 8, 50, 50)]
    r = run_replay(trace, 1, 8, "las", learning=LAS_800)
    assert starts(r) == {"long": [0, 150], "new": [100]}
    assert jct(r, trace) == {"new": 100, "long": 1050}


def test_las_ranks_by_queue_not_by_arrival() -> None:
    # at t=300, a (2400 GPU-s, second queue) and b (waiting, first queue) compete; b wins
    # although a arrived first; c (first queue, later arrival) waits behind b.
    trace = [j("a", 8, 0, 1000), j("b", 8, 300, 100), j("c", 8, 310, 100)]
    r = run_replay(trace, 1, 8, "las", learning=LAS_800)
    assert starts(r)["b"] == [300]
    assert starts(r)["c"] == [400]
    assert starts(r)["a"] == [0, 500]


def test_gittins_learns_from_jobs_finished_before_now() -> None:
    # c finished (80 GPU-s) before b arrives; a has run past anything seen (index 0), b has
    # attained nothing and may finish like c: b preempts a.
    trace = [j("c", 8, 0, 10), j("a", 8, 10, 1000), j("b", 8, 200, 10)]
    r = run_replay(trace, 1, 8, "gittins")
    assert starts(r)["b"] == [200]
    assert r.metrics.preemptions == 1


def test_gittins_never_uses_a_duration_of_a_job_not_finished_yet() -> None:
    # nothing has finished when b arrives: every index is the same and the order is
    # arrival, so a keeps running. Had the index seen the trace's durations (a: 8000, b: 80
    # GPU-s), b would rank first and preempt a at 10.
    trace = [j("a", 8, 0, 1000), j("b", 8, 10, 10)]
    r = run_replay(trace, 1, 8, "gittins")
    assert starts(r) == {"a": [0], "b": [1000]}
    assert r.metrics.preemptions == 0


def test_backfill_fills_the_hole_before_the_head_reservation() -> None:
    # a (6 GPUs) runs to 100; head (8) is reserved 100. short (2 GPUs, 50 s) ends before
    # it and starts at once; long (2 GPUs, 500 s) would delay the head and waits.
    trace = [j("a", 6, 0, 100), j("head", 8, 1, 10), j("short", 2, 2, 50), j("long", 2, 3, 500)]
    r = run_replay(trace, 1, 8, "backfill")
    assert starts(r) == {"a": [0], "short": [2], "head": [100], "long": [110]}
    assert r.reservations["head"] == 100
    fifo = run_replay(trace, 1, 8, "fifo")
    assert starts(fifo)["short"] == [110]  # fifo: behind the blocked head


def random_trace(seed: int, n: int, span_s: float, teams: int = 1) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    submits = np.sort(rng.uniform(0, span_s, n))
    out = []
    for k, s in enumerate(submits):
        gpus = int(rng.choice([1, 2, 4, 8], p=[0.5, 0.2, 0.2, 0.1]))
        team = f"t{k % teams}"
        scale = 600.0 * (1 + 9 * (k % teams))  # teams differ in how long their jobs run
        out.append(j(f"j{k}", gpus, float(s), float(rng.lognormal(np.log(scale), 1.0)), team))
    return out


def test_backfill_never_delays_a_head_reservation() -> None:
    trace = random_trace(3, 300, 20 * 3600.0)
    r = run_replay(trace, 1, 8, "backfill")
    first = {k: v[0] for k, v in starts(r).items()}
    assert len(r.reservations) > 20  # the head was blocked often: the property is tested
    for job_id, reserved in r.reservations.items():
        assert first[job_id] <= reserved + 1e-6, job_id
    order = sorted(trace, key=lambda x: x.submit_s)
    jumped = sum(first[b.job_id] < first[a.job_id] for a, b in itertools.pairwise(order))
    assert jumped > 0  # and backfilling happened
    assert r.metrics.preemptions == 0


SMALL_GUARD = GuardConfig(window_jobs=50, cold_start_s=86_400.0, min_finished=50)


def test_learned_with_the_model_kept_out_is_its_rule() -> None:
    """learning.rule (2D-Gittins by default) decides alone."""
    trace = random_trace(5, 500, 6 * 86_400.0, teams=3)
    rule = run_replay(trace, 4, 8, "gittins")
    # weight 0: no pick follows the prediction, whatever the guard says
    off = LearningConfig(predictor="recent-median", weight=0.0, guard=SMALL_GUARD)
    r = run_replay(trace, 4, 8, "learned", learning=off)
    assert r.retrains  # a model was trained, and ignored
    assert actions(r) == actions(rule)
    # a cold start longer than the trace: rules throughout
    cold = LearningConfig(predictor="recent-median", guard=GuardConfig(cold_start_s=1e9))
    r = run_replay(trace, 4, 8, "learned", learning=cold)
    assert r.trusted_s == 0
    assert actions(r) == actions(rule)


def test_an_unguarded_shuffled_model_replays_exactly_as_its_rule() -> None:
    """A model that knows nothing, in charge from the end of the cold start: its bins are
    shrunk to the unconditional distribution, so the replay is 2D-Gittins' decision for
    decision (without the shrinkage its bins' noise reorders jobs)."""
    trace = random_trace(5, 500, 6 * 86_400.0, teams=3)
    rule = run_replay(trace, 4, 8, "gittins")
    # every prediction used, however unsure (this model is unsure of all)
    cfg = LearningConfig(predictor="shuffled", guarded=False, guard=SMALL_GUARD, max_spread=1e9)
    r = run_replay(trace, 4, 8, "learned", learning=cfg)
    assert r.trusted_s > 0 and r.retrains
    assert actions(r) == actions(rule)


def test_learned_uses_a_good_model_and_differs_from_its_rule() -> None:
    trace = random_trace(5, 500, 6 * 86_400.0, teams=3)
    rule = run_replay(trace, 4, 8, "gittins")
    cfg = LearningConfig(predictor="recent-median", guard=SMALL_GUARD)
    r = run_replay(trace, 4, 8, "learned", learning=cfg)
    assert any(c.after.value == "trusted" for c in r.guard_changes)
    assert r.trusted_s > 0
    assert actions(r) != actions(rule)
    notes = [d for d in r.log.decisions if d.job_id == "learning"]
    assert [d.action for d in notes] == [f"guard-{c.after.value}" for c in r.guard_changes]


@pytest.mark.parametrize(
    ("options", "preemptive"),
    [
        ({}, True),
        ({"weight": 0.5}, True),
        ({"model_order": "remaining", "max_spread": 16.0}, True),
        ({"rule": "gittins"}, True),
        ({}, False),
    ],
)
def test_kept_sorted_waiting_keys_decide_as_keys_worked_out_afresh(
    options: dict[str, object], preemptive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay keeps waiting jobs' predicted keys between decisions; forgetting them at
    every decision (every job keyed anew, the slow way) must give the same decisions."""
    trace = random_trace(11, 300, 3 * 86_400.0, teams=3)
    cfg = LearningConfig(predictor="recent-median", guard=SMALL_GUARD, **options)  # type: ignore[arg-type]
    kept = run_replay(trace, 3, 8, "learned", learning=cfg, preemptive=preemptive)
    assert kept.trusted_s > 0  # the path is exercised
    assert (kept.metrics.preemptions > 0) is preemptive
    sync = ordered_replay._WaitingKeys.sync

    def afresh(self: ordered_replay._WaitingKeys, *args: object) -> object:
        self.forget()
        return sync(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ordered_replay._WaitingKeys, "sync", afresh)
    slow = run_replay(trace, 3, 8, "learned", learning=cfg, preemptive=preemptive)
    assert actions(slow) == actions(kept)


@pytest.mark.parametrize("queue", ["las", "gittins", "backfill", "learned"])
def test_same_trace_and_seed_give_the_same_decisions(queue: str) -> None:
    trace = random_trace(7, 300, 4 * 86_400.0, teams=2)
    cfg = LearningConfig(guard=SMALL_GUARD)  # the LightGBM predictor for learned
    a = run_replay(trace, 2, 8, queue, seed=1, learning=cfg)
    b = run_replay(list(reversed(trace)), 2, 8, queue, seed=1, learning=cfg)
    assert a.log.render(a.node_names) == b.log.render(b.node_names)
    assert a.guard_changes == b.guard_changes


def test_preemptive_queues_finish_every_job_once() -> None:
    trace = random_trace(11, 400, 2 * 86_400.0, teams=2)
    for queue in ("las", "gittins"):
        r = run_replay(trace, 2, 8, queue)
        finishes = [d.job_id for d in r.log.decisions if d.action == "finish"]
        assert sorted(finishes) == sorted(x.job_id for x in trace)
        assert r.metrics.preemptions > 0
        # a job's total run time is its duration, however often it was preempted
        ran: dict[str, float] = {}
        since: dict[str, float] = {}
        for d in r.log.decisions:
            if d.action == "start":
                since[d.job_id] = d.time_s
            elif d.action in ("finish", "preempt"):
                ran[d.job_id] = ran.get(d.job_id, 0.0) + d.time_s - since.pop(d.job_id)
        for x in trace:
            assert ran[x.job_id] == pytest.approx(x.duration_s, rel=1e-9, abs=1e-6)


def test_the_queues_are_explained_in_replay_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "simulate", "replay", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for word in ("backfill", "las", "gittins", "learned", "--predictor", "--unguarded"):
        assert word in out
    assert "2D-LAS" in out and "2D-Gittins" in out and "EASY" in out


def test_replay_command_reports_the_guard_of_a_learned_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = random_trace(13, 700, 21 * 86_400.0)
    csv = tmp_path / "cluster99.csv"
    csv.write_text(
        "job_id,submission_time,duration,num_gpu\n"
        + "".join(f"{x.job_id},{x.submit_s:.0f},{x.duration_s:.0f},{x.gpu_count}\n" for x in trace)
    )
    argv = ["simulate", "replay", "--trace", str(csv), "--nodes", "3", "--queue", "learned"]
    assert main([*argv, "--predictor", "recent-median"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("cluster99:"))
    assert "model(s) trained" in line and "guard change(s)" in line
    assert "model trusted" in line


def test_unguarded_learned_uses_the_model_from_the_end_of_the_cold_start() -> None:
    trace = random_trace(5, 500, 6 * 86_400.0, teams=3)
    cfg = LearningConfig(predictor="inverted", guarded=False, guard=SMALL_GUARD)
    r = run_replay(trace, 4, 8, "learned", learning=cfg)
    first_model = r.retrains[0].trained_at_s
    end = max(d.time_s for d in r.log.decisions)
    # from the first model (after the one-day cold start) to the end, whatever its accuracy
    assert first_model >= SMALL_GUARD.cold_start_s
    assert r.trusted_s == pytest.approx(end - max(first_model, SMALL_GUARD.cold_start_s), rel=0.05)
