"""The learned policy in the live service: what is stored (its mode, promotions and their
evidence, the finished jobs its replay reads back with their GPU-time), the bounded shadow
record, the promotion check, and the service carrying it all out (fake fleet, fake
executor, manual clock, a real SQLite store), then once through a real `gpupool serve`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from gpupool.cli.learn import learning_config_of, replay_history, verdict
from gpupool.errors import ConflictError
from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import GuardConfig
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.commands import LearnShadow
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.loop.learning import Evidence, ShadowTally, check_evidence, outcomes_of
from gpupool.server.store import NewJob, NewService, ServiceMinute, Store
from service_proc import HTTP, cli, configured_server, wait_for

T0 = 1_000_000.0
DAY = 86_400.0


def new_job(store: Store, name: str, gpus: int, at_s: float, team: str = "ml") -> int:
    row, _ = store.jobs.submit(NewJob(name, team, "training", 0, gpus, ("true",)), at_s)
    return row.id


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path}/db.sqlite")
    s.migrate()
    return s


# ---- what is stored --------------------------------------------------------------------
def test_finished_runs_are_the_completed_jobs_of_the_window_with_their_gpu_time(
    store: Store,
) -> None:
    whole = new_job(store, "resnet", 2, T0)
    store.jobs.transition(whole, "running", T0 + 10, gpus=(("h", 0), ("h", 1)))
    store.jobs.transition(whole, "succeeded", T0 + 40)
    # preempted once: its GPU time is both runs, the checkpointing included, not the wait
    twice = new_job(store, "bert", 1, T0 + 1)
    store.jobs.transition(twice, "running", T0 + 10, gpus=(("h", 2),))
    store.jobs.transition(twice, "preempting", T0 + 20)
    store.jobs.transition(twice, "suspended", T0 + 22)
    store.jobs.transition(twice, "running", T0 + 50)
    store.jobs.transition(twice, "succeeded", T0 + 60)
    cancelled = new_job(store, "gpt", 1, T0 + 2)
    store.jobs.transition(cancelled, "running", T0 + 10)
    store.jobs.transition(cancelled, "cancelled", T0 + 30)
    running = new_job(store, "vit", 1, T0 + 3)
    store.jobs.transition(running, "running", T0 + 10)
    old = new_job(store, "old", 1, T0 - 3 * DAY)
    store.jobs.transition(old, "running", T0 - 3 * DAY + 1)
    store.jobs.transition(old, "succeeded", T0 - 2 * DAY)
    cpu = new_job(store, "etl", 0, T0 + 4)
    store.jobs.transition(cpu, "running", T0 + 10)
    store.jobs.transition(cpu, "succeeded", T0 + 20)

    runs = store.history.finished_runs(T0 - DAY, T0 + 100)
    assert [r.job_id for r in runs] == [whole, twice]  # in order of finish
    assert runs[0].gpu_time_s == pytest.approx(2 * 30.0)
    assert runs[1].gpu_time_s == pytest.approx(12.0 + 10.0)
    assert (runs[1].name, runs[1].team, runs[1].submit_s, runs[1].finish_s) == (
        "bert",
        "ml",
        T0 + 1,
        T0 + 60,
    )
    assert [r.job_id for r in store.history.finished_runs(None, T0 + 100)] == [old, whole, twice]
    outcomes = outcomes_of(runs)
    assert [(o.facts.job_id, o.facts.name, o.gpu_time_s) for o in outcomes] == [
        (str(whole), "resnet", pytest.approx(60.0)),
        (str(twice), "bert", pytest.approx(22.0)),
    ]


def test_the_learning_mode_and_its_changes_survive_reopening_the_database(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with Store(url) as s:
        s.migrate()
        assert s.settings.learning_mode() is None
        s.settings.set_learning_mode("shadow", T0, "the configured mode, at first start")
        evidence = {"days": 14.0, "jobs": 300, "rule": "las", "rule_mean_jct_s": 9.0}
        s.settings.set_learning_mode(
            "active", T0 + 5, "won", action="promote", by="ops", evidence=evidence
        )
        s.settings.set_learning_mode("shadow", T0 + 9, "drift", action="demote", by="ops")
    with Store(url) as s:
        mode = s.settings.learning_mode()
        assert mode is not None
        assert (mode.mode, mode.set_at_s, mode.reason) == ("shadow", T0 + 9, "drift")
        changes = s.settings.learning_changes()
        assert [(c.action, c.mode, c.by) for c in changes] == [
            ("demote", "shadow", "ops"),
            ("promote", "active", "ops"),
        ]
        assert changes[1].evidence == evidence
        with pytest.raises(Exception, match="learning mode must be one of"):
            s.settings.set_learning_mode("off", T0 + 10, "no such mode")


# ---- the shadow record -------------------------------------------------------------------
def test_differing_shadow_cycles_are_counted_and_written_at_most_once_a_minute() -> None:
    tally = ShadowTally(every_s=60.0)
    written = []
    for t in range(120):
        differ = t % 2 == 0
        c = LearnShadow(float(t), ("1",), ("2",) if differ else ("1",))
        due = tally.record(c)
        if due is not None:
            written.append((t, due[1]["differing_cycles"], due[0]))
    assert (tally.differed, tally.written) == (60, 2)
    assert [(t, n) for t, n, _ in written] == [(0, 1), (60, 30)]
    assert "would have started 2; the rules started 1" in written[1][2]
    assert "stands for 30 differing cycles" in written[1][2]


# ---- the promotion check -------------------------------------------------------------------
def evidence(jobs: int, rule_s: float, learned_s: float, rule: str = "las") -> Evidence:
    return Evidence(14.0, jobs, rule, rule_s, learned_s)


def test_promotion_is_refused_unless_the_replay_shows_a_win_on_enough_jobs() -> None:
    with pytest.raises(ConflictError, match=r"mean JCT is 120\.0 s, not below las's 100\.0 s"):
        check_evidence(evidence(300, 100.0, 120.0), "las", 200, 400)
    with pytest.raises(ConflictError, match="not below"):  # a tie is no win
        check_evidence(evidence(300, 100.0, 100.0), "las", 200, 400)
    with pytest.raises(ConflictError, match="fewer than the 200"):
        check_evidence(evidence(150, 100.0, 80.0), "las", 200, 400)
    with pytest.raises(ConflictError, match="only 100 finished here"):
        check_evidence(evidence(300, 100.0, 80.0), "las", 200, 100)
    with pytest.raises(ConflictError, match="falls back to 'las'"):
        check_evidence(evidence(300, 100.0, 80.0, rule="gittins"), "las", 200, 400)
    check_evidence(evidence(300, 100.0, 80.0), "las", 200, 400)  # a win on enough jobs


def test_the_cli_says_both_figures_when_the_replay_loses() -> None:
    lose = {"days": 7.0, "jobs": 50, "rule": "las", "rule_mean_jct_s": 10.0}
    ok, sentence = verdict({**lose, "learned_mean_jct_s": 12.5}, 20)
    assert not ok
    assert "12.5 s learned against 10.0 s las over 50 jobs" in sentence
    ok, sentence = verdict({**lose, "learned_mean_jct_s": 8.0}, 20)
    assert ok and "20.0% less" in sentence
    ok, sentence = verdict({**lose, "learned_mean_jct_s": 8.0}, 80)
    assert not ok and "fewer than the 80" in sentence
    ok, sentence = verdict({"days": 7.0, "jobs": 0, "rule": "las"}, 1)
    assert not ok and "nothing to replay" in sentence


# ---- the live service (fake fleet, fake executor, manual clock) ---------------------------
SHADOW = LearningConfig(
    mode="shadow",
    rule="las",
    predictor="recent-median",
    model_order="remaining",
    guard=GuardConfig(window_jobs=10, min_finished=10, cold_start_s=0.0),
)
"""Shadow over 2D-LAS, the model trusted after 10 judged predictions (the recent-median
model trains once 20 jobs finished): a cluster's weeks in a test's minutes. These tests
check the live plumbing (shadow records, the promotion replay and its verdict), so the
model's order follows its predictions as they are (model_order remaining, judged on their
accuracy): the default conditional order shrinks a model toward the rule until its own
judged predictions show it knows something, which a few dozen jobs do not."""
LONG_S, SHORT_S, WAVE_S, STEP_S = 120.0, 20.0, 100.0, 10.0
"""A wave every 100 s: a long training job (team train) then a short one (team sweep),
140 s of work for one GPU every 100 s, so a queue builds and its order matters."""


class Live:
    """One service on one GPU, driven step by step; jobs end after their planned time."""

    def __init__(self, state: Path, policy: str, learning: LearningConfig) -> None:
        state.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.clock = ManualClock(T0)
        self.store = Store(f"sqlite:///{state}/db.sqlite")
        self.store.migrate()
        self.executor = FakeExecutor()
        self.scheduling = dataclasses.replace(LIVE_DEFAULTS, policy=policy, learning=learning)
        self.planned: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.services: list[LiveService] = []
        self.service = self.open()

    def open(self) -> LiveService:
        """A (re)started service on the same database."""
        service = LiveService(
            LiveConfig(self.state / "run", self.scheduling, sample_s=0.0, host="h"),
            self.store,
            self.executor,
            FakeTelemetry("1xA100-80GB"),
            self.clock,
        )
        self.services.append(service)
        self.service = service
        return service

    def submit(self, name: str, team: str, run_s: float) -> int:
        row, _ = self.store.jobs.submit(
            NewJob(name, team, "training", 0, 1, ("true",)), self.clock.now()
        )
        self.planned[str(row.id)] = run_s
        return row.id

    def step(self) -> None:
        self.clock.advance(STEP_S)
        now = self.clock.now()
        for job_id in self.executor.handles():
            start = self.started.setdefault(job_id, now)
            if now - start >= self.planned[job_id]:
                self.executor.finish(job_id)
        self.service.step()
        for job_id in self.executor.handles():
            self.started.setdefault(job_id, self.clock.now())

    def waves(self, n: int) -> None:
        for _ in range(n):
            self.submit("finetune", "train", LONG_S)
            self.submit("eval", "sweep", SHORT_S)
            for _ in range(int(WAVE_S / STEP_S)):
                self.step()

    def drain(self, limit_steps: int = 2_000) -> None:
        for _ in range(limit_steps):
            if not self.store.jobs.active():
                return
            self.step()
        raise AssertionError("the queue did not drain")

    def launches(self) -> list[str]:
        return [job for verb, job in self.executor.calls if verb == "launch"]

    def events(self, kind: str) -> list[Any]:
        return [e for e in self.store.events.after(0, limit=100_000) if e.kind == kind]

    def close(self) -> None:
        for s in self.services:
            s.stop()
        self.store.close()


@pytest.fixture
def lives(tmp_path: Path) -> Iterator[list[Live]]:
    made: list[Live] = []
    yield made
    for live in made:
        live.close()


def test_a_restart_feeds_each_forecaster_its_history(tmp_path: Path, lives: list[Live]) -> None:
    """A restarted server reads its services' per-minute rates back from the telemetry
    history: the forecaster is past its cold start at once, not 14 days later."""
    live = Live(tmp_path / "a", "las", LearningConfig())
    lives.append(live)
    live.scheduling = dataclasses.replace(live.scheduling, autoscale_demand="forecast")
    live.service.stop()
    first = live.open()
    first.operations.create_service(
        NewService("chat", "web", ("serve",), 0, 2, slo_p99_ms=200.0, replica_rps=10.0)
    )
    first.stop()
    days = 16
    start = T0 - days * DAY
    rows = [
        ServiceMinute("chat", start + k * 60.0, 60.0, None, 50.0 + 40.0 * ((k // 60) % 24 > 8), 0)
        for k in range(days * 1440)
    ]
    live.store.history.add([], rows)

    again = live.open()
    live.step()
    shown = again.views.learning_view()["forecasts"]["chat"]
    assert shown["history_days"] >= days - 0.1, shown
    assert shown["model_version"] >= 1 and shown["state"] != "cold", shown
    guard = [e.message for e in live.events("learn-guard")]
    assert any(m.startswith("forecast chat ") and "cold" not in m for m in guard), guard


def test_the_forecast_is_promoted_on_its_guards_record_and_keeps_its_mode(
    tmp_path: Path, lives: list[Live]
) -> None:
    """The demand forecast starts in shadow (configured so): its promotion is refused while
    its guard does not trust it (the figures said), granted once it does, recorded with the
    service's errors as evidence, and kept over a restart; a demotion returns it."""
    live = Live(tmp_path / "a", "las", LearningConfig())
    lives.append(live)
    # hourly steps: the guard judges as on the default 10 minutes, on a sixth of the forecasts
    shadow = dataclasses.replace(LIVE_DEFAULTS.autoscale_forecast, mode="shadow", step_s=3600.0)
    live.scheduling = dataclasses.replace(
        live.scheduling, autoscale_demand="forecast", autoscale_forecast=shadow
    )
    live.service.stop()
    first = live.open()
    first.operations.create_service(
        NewService("chat", "web", ("serve",), 0, 2, slo_p99_ms=200.0, replica_rps=10.0)
    )
    live.step()
    with pytest.raises(ConflictError, match=r"refused: .*chat: 0\.0 of 14 days of history"):
        first.operations.promote_learner("forecast", "ops")
    first.stop()
    days = 22  # the cold start's 14, and a week judged: weekends the opponents get wrong
    start = T0 - days * DAY
    noise = np.random.default_rng(0).normal(0.0, 3.0, days * 1440)
    rows = [
        ServiceMinute(
            "chat",
            start + k * 60.0,
            60.0,
            None,
            (0.6 if (k // 1440) % 7 >= 5 else 1.0) * (100.0 + 80.0 * np.sin(np.pi * k / 720))
            + noise[k],
            0,
        )
        for k in range(days * 1440)
    ]
    live.store.history.add([], rows)
    again = live.open()
    live.step()
    view = again.views.learning_view()
    assert view["forecast_mode"] == "shadow" and view["forecast_last_change"] is None
    standing = view["forecasts"]["chat"]
    assert standing["state"] == "trusted", standing  # the guard trusts it (in shadow)
    with pytest.raises(ConflictError, match="in shadow already"):
        again.operations.demote_learner("forecast", "ops")
    after = again.operations.promote_learner("forecast", "ops")
    assert after["forecast_mode"] == "active"
    change = after["forecast_last_change"]
    assert (change["action"], change["learner"], change["by"]) == ("promote", "forecast", "ops")
    assert change["evidence"]["services"]["chat"]["state"] == "trusted"
    assert "trusted by its guard for 1 of 1 services" in change["reason"]
    assert after["last_change"] is None  # the job order's record is its own
    with pytest.raises(ConflictError, match="active already"):
        again.operations.promote_learner("forecast", "ops")
    again.stop()

    third = live.open()
    live.clock.advance(STEP_S)
    third.step()  # (replicas it starts stay up: not the harness's planned jobs)
    assert third.views.learning_view()["forecast_mode"] == "active"
    guard = [e.message for e in live.events("learn-guard")]
    assert any(m.startswith("forecast promoted: promoted by ops") for m in guard), guard
    assert any(m.startswith("forecast promoted: restored at start") for m in guard), guard
    third.operations.demote_learner("forecast", "ops", "a holiday week")
    assert third.views.learning_view()["forecast_mode"] == "shadow"
    assert live.store.settings.learning_mode("forecast").reason == "demoted by ops: a holiday week"
    assert live.store.settings.learning_mode() is None  # the job order's mode is untouched


def test_shadow_decisions_never_reach_the_executor(tmp_path: Path, lives: list[Live]) -> None:
    rule = Live(tmp_path / "rule", "las", LearningConfig())
    shadow = Live(tmp_path / "shadow", "learned", SHADOW)
    lives += [rule, shadow]
    for live in (rule, shadow):
        live.waves(13)
        live.drain()
    records = shadow.events("learn-shadow")
    assert records, "the learned plan never differed: the test would prove nothing"
    # where they differed the learned policy wanted the short job first, the rules did not
    assert any(set(r.data["learned_starts"]) - set(r.data["rule_starts"]) for r in records), records
    assert shadow.launches() == rule.launches()  # the same launches, in the same order
    status = shadow.service.views.learning_view()["status"]
    assert status["mode"] == "shadow" and status["shadow_cycles"] > 0
    assert status["agreement"] is not None and status["agreement"] < 1.0


def test_a_restart_keeps_the_mode_and_the_history(tmp_path: Path, lives: list[Live]) -> None:
    live = Live(tmp_path / "a", "learned", SHADOW)
    lives.append(live)
    live.waves(12)
    live.drain()
    finished = len(live.store.history.finished_runs(None, live.clock.now()))
    win = {"days": 1.0, "jobs": finished, "rule": "las", "rule_mean_jct_s": 300.0}
    live.service.operations.promote_learning({**win, "learned_mean_jct_s": 200.0}, "ops")
    assert live.service.views.learning_view()["mode"] == "active"
    with pytest.raises(ConflictError, match="active already"):
        live.service.operations.promote_learning({**win, "learned_mean_jct_s": 200.0}, "ops")
    live.service.stop()

    again = live.open()
    view = again.views.learning_view()
    assert view["mode"] == "active"
    assert view["status"]["finished_seen"] == finished  # seeded from the database
    assert view["last_change"]["action"] == "promote"
    assert view["last_change"]["evidence"]["learned_mean_jct_s"] == 200.0
    guard = [e.message for e in live.events("learn-guard")]
    assert any("promoted by ops" in m for m in guard), guard
    assert any("restored at start" in m for m in guard), guard

    again.operations.demote_learning("ops", "testing the way back")
    again.stop()
    assert live.open().views.learning_view()["mode"] == "shadow"


def test_after_promotion_the_decisions_are_the_learned_ones(
    tmp_path: Path, lives: list[Live]
) -> None:
    live = Live(tmp_path / "a", "learned", SHADOW)
    lives.append(live)
    live.waves(18)
    live.drain()
    assert live.service.views.learning_view()["status"]["guard"] == "trusted"
    blocker = live.submit("finetune", "train", LONG_S)
    live.step()
    long_job = live.submit("finetune", "train", LONG_S)
    short_job = live.submit("eval", "sweep", SHORT_S)
    live.step()
    assert live.launches()[-1] == str(blocker)
    finished = len(live.store.history.finished_runs(None, live.clock.now()))
    live.service.operations.promote_learning(
        {
            "days": 1.0,
            "jobs": finished,
            "rule": "las",
            "rule_mean_jct_s": 300.0,
            "learned_mean_jct_s": 200.0,
        },
        "ops",
    )
    live.drain()
    order = live.launches()
    assert order.index(str(short_job)) < order.index(str(long_job))  # the short one first


# ---- the API ---------------------------------------------------------------------------------
def test_the_api_shows_refuses_a_losing_promotion_and_serves_the_window(
    tmp_path: Path, lives: list[Live]
) -> None:
    live = Live(tmp_path / "a", "learned", SHADOW)
    lives.append(live)
    live.waves(6)
    cancelled = live.submit("finetune", "train", LONG_S)
    live.service.operations.cancel(cancelled)
    live.waves(6)  # the queue still holds jobs: only the finished ones are history
    admin = live.store.auth.create_token("admin", None, T0)
    team = live.store.auth.create_token("ml", "train", T0)
    client = TestClient(create_app(live.service, live.store, auth=True))
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_team = {"Authorization": f"Bearer {team}"}

    shown = client.get("/v1/learn", headers=as_team)
    assert shown.status_code == 200, shown.text
    assert shown.json()["mode"] == "shadow" and shown.json()["status"]["submits_seen"] > 0

    now = live.clock.now()
    for days in (0.005, 1.0):
        got = client.get("/v1/learn/history", params={"days": days}, headers=as_team).json()
        expected = [
            r.id
            for r in live.store.jobs.list(limit=10_000)
            if r.state == "succeeded" and r.ended_at is not None and r.ended_at >= now - days * DAY
        ]
        assert sorted(j["id"] for j in got["jobs"]) == sorted(expected)
        assert got["fleet"] == {"nodes": 1, "gpus": 1, "gpus_per_node": [1]}
    assert cancelled not in [j["id"] for j in got["jobs"]]
    assert 0 < len(got["jobs"]) < len(live.store.jobs.list(limit=10_000))
    assert all(j["run_gpu_s"] > 0 for j in got["jobs"])

    jobs = len(got["jobs"])
    lose = {"days": 1.0, "jobs": jobs, "rule": "las", "rule_mean_jct_s": 100.0}
    body = {"evidence": {**lose, "learned_mean_jct_s": 130.0}}
    refused = client.post("/v1/learn/promote", json=body, headers=as_team)
    assert refused.status_code == 403
    refused = client.post("/v1/learn/promote", json=body, headers=as_admin)
    assert refused.status_code == 409
    assert "130.0 s, not below las's 100.0 s" in refused.json()["detail"]
    inflated = {"evidence": {**lose, "jobs": jobs + 50, "learned_mean_jct_s": 50.0}}
    refused = client.post("/v1/learn/promote", json=inflated, headers=as_admin)
    assert refused.status_code == 409 and "finished here" in refused.json()["detail"]
    assert client.get("/v1/learn", headers=as_team).json()["mode"] == "shadow"
    assert not live.store.settings.learning_changes()

    won = client.post(
        "/v1/learn/promote",
        json={"evidence": {**lose, "learned_mean_jct_s": 70.0}},
        headers=as_admin,
    )
    assert won.status_code == 200 and won.json()["mode"] == "active"
    back = client.post("/v1/learn/demote", json={"reason": "drill"}, headers=as_admin)
    assert back.status_code == 200 and back.json()["mode"] == "shadow"


def test_a_server_without_the_learned_policy_says_so(tmp_path: Path, lives: list[Live]) -> None:
    live = Live(tmp_path / "a", "las", LearningConfig())
    lives.append(live)
    client = TestClient(create_app(live.service, live.store, auth=False))
    for path in ("/v1/learn", "/v1/learn/history"):
        got = client.get(path)
        assert got.status_code == 404
        assert "not 'learned'" in got.json()["detail"] and "policy: learned" in got.json()["detail"]
    got = client.post("/v1/learn/demote", json={})
    assert got.status_code == 404


# ---- the CLI's replay of the cluster's own history -----------------------------------------
def history(waves: int, every_s: float, short_first: bool = False) -> dict[str, Any]:
    """What GET /v1/learn/history returns: a long and a short job every `every_s`."""
    jobs = []
    pair = [("finetune", "train", LONG_S), ("eval", "sweep", SHORT_S)]
    for k in range(waves):
        for n, (name, team, run_s) in enumerate(pair[::-1] if short_first else pair):
            at = T0 + k * every_s + n
            jobs.append(
                {
                    "id": 2 * k + n + 1,
                    "team": team,
                    "name": name,
                    "gpu_count": 1,
                    "gpu_model": None,
                    "submit_s": at,
                    "run_gpu_s": run_s,
                    "finish_s": at + run_s,
                }
            )
    return {
        "days": 1.0,
        "now_s": T0 + waves * every_s,
        "fleet": {"nodes": 1, "gpus": 1, "gpus_per_node": [1]},
        "jobs": jobs,
    }


def test_the_replay_of_a_queue_with_short_jobs_behind_long_ones_is_a_win() -> None:
    config = learning_config_of(dataclasses.asdict(SHADOW))
    assert config == SHADOW  # the server's section survives its JSON
    ev = replay_history(history(30, WAVE_S), config)
    assert ev["jobs"] == 60 and ev["rule"] == "las"
    assert ev["learned_mean_jct_s"] < ev["rule_mean_jct_s"]
    ok, sentence = verdict(ev, SHADOW.guard.min_finished)
    assert ok, sentence


def test_promotion_is_refused_when_the_replay_shows_no_win() -> None:
    # the short job comes first and the long one is done before the next pair: any order
    # gives the same JCTs, and a tie is no win
    ev = replay_history(history(30, 1_000.0, short_first=True), SHADOW)
    assert ev["learned_mean_jct_s"] == pytest.approx(ev["rule_mean_jct_s"])
    ok, sentence = verdict(ev, SHADOW.guard.min_finished)
    assert not ok and "does not win" in sentence


MEASURED_RUNS = (
    [(k * 0.2, 10.2 + 0.05 * (k % 3), 5.8 + 0.04 * (k % 4)) for k in range(15)],
    [10.3, 10.19, 10.44, 10.33, 10.22, 10.22],
    [5.81, 6.08, 6.01, 6.01, 5.82, 5.77],
)
"""A run of the real-server test below, measured under load: 15 long and short pairs at
once, then six long jobs and six short ones behind them, where the second batch's short
jobs ran past the 90th percentile of the first batch's."""


def measured_history() -> dict[str, Any]:
    pairs, longs, shorts = MEASURED_RUNS
    rows: list[tuple[str, str, float, float]] = []
    for at, long_s, short_s in pairs:
        rows += [("finetune", "train", at, long_s), ("eval", "sweep", at + 0.1, short_s)]
    rows += [("finetune", "train", 66.5 + 0.1 * k, run) for k, run in enumerate(longs)]
    rows += [("eval", "sweep", 67.1 + 0.1 * k, run) for k, run in enumerate(shorts)]
    jobs = [
        {
            "id": n + 1,
            "team": team,
            "name": name,
            "gpu_count": 1,
            "gpu_model": None,
            "submit_s": T0 + at,
            "run_gpu_s": run_s,
            "finish_s": T0 + at + run_s,
        }
        for n, (name, team, at, run_s) in enumerate(rows)
    ]
    fleet = {"nodes": 1, "gpus": 4, "gpus_per_node": [4]}
    return {"days": 1.0, "now_s": T0 + 100.0, "fleet": fleet, "jobs": jobs}


def test_the_promotion_replay_does_not_preempt_as_the_live_core_does_not() -> None:
    # the live core's ordered policies only choose which waiting job starts next; a
    # preemptive replay judges another policy, one that suspends running jobs, and gives
    # other figures than the one the live core would run
    from gpupool.domain.model import JobSpec
    from gpupool.sim.replay.run import run_replay

    hist = measured_history()
    jobs = [
        JobSpec(
            str(j["id"]),
            1,
            team=j["team"],
            submit_s=j["submit_s"] - T0,
            duration_s=j["run_gpu_s"],
            name=j["name"],
        )
        for j in hist["jobs"]
    ]
    active = dataclasses.replace(SHADOW, mode="active")
    runs = {
        (queue, preemptive): run_replay(
            jobs, 1, 4, queue=queue, learning=active, origin_s=T0, preemptive=preemptive
        )
        for queue in ("las", "learned")
        for preemptive in (True, False)
    }
    preempts = {key: sum(d.action == "preempt" for d in r.log.decisions) for key, r in runs.items()}
    assert preempts[("learned", True)] > 0 and preempts[("las", True)] == 0
    assert preempts[("learned", False)] == preempts[("las", False)] == 0
    mean = {key: r.metrics.avg_jct_s for key, r in runs.items()}
    assert mean[("learned", True)] != pytest.approx(mean[("learned", False)])
    ev = replay_history(hist, SHADOW)
    assert ev["learned_mean_jct_s"] == pytest.approx(mean[("learned", False)])
    assert ev["rule_mean_jct_s"] == pytest.approx(mean[("las", False)])
    ok, sentence = verdict(ev, SHADOW.guard.min_finished)
    assert ok, sentence


# ---- through a real `gpupool serve` ------------------------------------------------------
SERVE_CONFIG = """\
teams:
  - {name: train}
  - {name: sweep}
online_reserve: 0
policy: learned
learning:
  mode: shadow
  rule: las
  predictor: recent-median
  model_order: remaining
  guard: {window_jobs: 10, min_finished: 10, cold_start_s: 0}
"""
"""The learned policy in shadow over 2D-LAS; the model (recent median GPU-time of the
team's jobs) trains once 20 jobs finished and is trusted after 10 judged predictions; its
order follows the predictions as they are (see SHADOW)."""


def post_job(url: str, name: str, team: str, sleep_s: float) -> int:
    body = {"name": name, "team": team, "gpus": 1, "command": ["sleep", str(sleep_s)]}
    got = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10)
    assert got.status_code == 201, got.text
    job_id: int = got.json()["id"]
    return job_id


def job_state(url: str, job_id: int) -> str:
    state: str = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()["state"]
    return state


def started_at(url: str, job_id: int) -> float:
    evs = HTTP.get(f"{url}/v1/jobs/{job_id}/events", timeout=10).json()["events"]
    return min(float(e["at_s"]) for e in evs if e["kind"] == "running")


LONG_RUN_S, SHORT_RUN_S = 10.0, 5.6
"""Real jobs' run times: the core counts a run's first 5 s as process start (calibration's
process_start_s), so these are about 5 and 0.6 GPU-seconds of work to the core's learner;
the replay runs them for the time they held their GPUs (10.3 and 5.9 s or so)."""


def all_succeeded(url: str, jobs: list[int]) -> bool:
    return all(job_state(url, j) == "succeeded" for j in jobs)


@pytest.mark.slow  # real processes on four GPUs: two and a half minutes or so
def test_shadow_then_promotion_through_the_real_server(tmp_path: Path) -> None:
    server = configured_server(tmp_path, SERVE_CONFIG, gpus="4xA100-80GB").start()
    try:
        url = server.url
        # two weeks of a cluster in a minute: the same two jobs 15 times (the model trains
        # once 20 finished and is trusted on the next 10), then six long jobs and six
        # short ones behind them, where the order matters
        first = []
        for _ in range(15):
            first.append(post_job(url, "finetune", "train", LONG_RUN_S))
            first.append(post_job(url, "eval", "sweep", SHORT_RUN_S))
        wait_for(lambda: all_succeeded(url, first), 240, "the first jobs to end")
        second = [post_job(url, "finetune", "train", LONG_RUN_S) for _ in range(6)]
        second += [post_job(url, "eval", "sweep", SHORT_RUN_S) for _ in range(6)]
        wait_for(lambda: all_succeeded(url, second), 240, "the second jobs to end")
        out = cli(url, "learn", "status", "--days", "1", timeout_s=120)
        assert out.returncode == 0, out.stderr
        assert "mode shadow" in out.stdout and "42 finished" in out.stdout, out.stdout
        assert "guard:      trusted" in out.stdout, out.stdout
        assert "learned" in out.stdout and "las" in out.stdout
        shown = json.loads(cli(url, "learn", "status", "--days", "1", "--json").stdout)
        assert shown["replay"]["jobs"] == 42 and shown["replay_wins"], shown["replay"]
        assert shown["status"]["shadow_cycles"] > 0

        out = cli(url, "learn", "promote", "--days", "1", timeout_s=120)
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "now active" in out.stdout
        assert HTTP.get(f"{url}/v1/learn", timeout=10).json()["mode"] == "active"

        # every GPU busy, then a long job and a short one; when one GPU frees, the short
        # one starts and the long one waits (2D-LAS would start the long one: it came
        # first and neither has had any service)
        holders = [post_job(url, "finetune", "train", 60.0) for _ in range(3)]
        holders.append(post_job(url, "finetune", "train", 8.0))
        wait_for(lambda: all(job_state(url, j) == "running" for j in holders), 30, "all GPUs busy")
        long_job = post_job(url, "finetune", "train", LONG_RUN_S)
        short_job = post_job(url, "eval", "sweep", SHORT_RUN_S)
        wait_for(lambda: job_state(url, short_job) != "pending", 60, "the short job to start")
        assert job_state(url, long_job) == "pending"
        assert job_state(url, holders[0]) == "running"  # only one GPU had freed
        for j in holders[:3]:
            HTTP.post(f"{url}/v1/jobs/{j}/cancel", timeout=10)
        wait_for(lambda: job_state(url, long_job) != "pending", 60, "the long job to start")
        assert started_at(url, short_job) < started_at(url, long_job)
    finally:
        server.stop()


@pytest.mark.slow  # LightGBM retrains every 300 s over 300 replayed jobs: half a minute
def test_promotion_is_refused_when_a_wrong_model_loses_the_replay() -> None:
    # the inverted predictor calls short long and long short; unguarded, the learned order
    # follows it and puts the long jobs first
    wrong = dataclasses.replace(SHADOW, predictor="inverted", guarded=False, retrain_every_s=300.0)
    ev = replay_history(history(150, WAVE_S), wrong)
    assert ev["learned_mean_jct_s"] > 1.2 * ev["rule_mean_jct_s"]
    ok, sentence = verdict(ev, SHADOW.guard.min_finished)
    assert not ok and "does not win" in sentence


FORECAST_CONFIG = """\
teams:
  - {name: web}
online_reserve: 0
autoscale: {demand: forecast}
"""
"""A server that learns its services' demand (and no job order)."""


def test_demand_forecasts_through_the_real_server(tmp_path: Path) -> None:
    """A new service scales on the reactive rule while its forecaster is cold; the event
    log says so, and `gpupool learn status` shows the forecaster (a server without the
    learned order shows only that)."""
    server = configured_server(tmp_path, FORECAST_CONFIG, gpus="2xA100-80GB").start()
    try:
        url = server.url
        chat = {
            "name": "chat",
            "team": "web",
            "command": ["sleep", "600"],
            "min_replicas": 0,
            "max_replicas": 2,
            "replica_rps": 10,
        }
        assert HTTP.post(f"{url}/v1/services", json=chat, timeout=10).status_code == 201

        def forecasters() -> dict[str, Any]:
            got: dict[str, Any] = HTTP.get(f"{url}/v1/learn", timeout=10).json()["forecasts"]
            return got

        wait_for(lambda: "chat" in forecasters(), 30, "the service's first measured rate")
        view = HTTP.get(f"{url}/v1/learn", timeout=10).json()
        assert view["order"] is False and view["demand"] == "forecast"
        assert view["forecasts"]["chat"]["state"] == "cold"

        def said() -> list[str]:
            events = HTTP.get(f"{url}/v1/events", params={"after": 0}, timeout=10).json()
            return [e["message"] for e in events["events"] if e["kind"] == "learn-guard"]

        wait_for(lambda: bool(said()), 30, "the forecaster's first standing in the event log")
        assert said() == [
            "forecast chat cold: 0.0 of 14 days of history: the reactive rule scales the service"
        ]
        out = cli(url, "learn", "status", timeout_s=60)
        assert out.returncode == 0, out.stderr
        assert "demand forecasts: mode active (the configured mode)" in out.stdout, out.stdout
        assert "trusted after 14 days" in out.stdout, out.stdout
        row = next(line for line in out.stdout.splitlines() if line.startswith("chat"))
        assert "cold" in row and "reactive rule" in row, out.stdout
        shown = json.loads(cli(url, "learn", "status", "--json").stdout)
        assert shown["forecasts"]["chat"]["model_version"] == 0
        # promotion per learner, from the command line: the forecast's own record decides
        again = cli(url, "learn", "promote", "forecast")
        assert again.returncode != 0 and "active already" in again.stderr, again
        down = cli(url, "learn", "demote", "forecast", "--reason", "a rehearsal")
        assert down.returncode == 0, down.stderr
        assert "forecast learner is now in shadow" in down.stdout, down.stdout
        refused = cli(url, "learn", "promote", "forecast")
        assert refused.returncode != 0, refused
        assert "promotion of the forecast learner refused" in refused.stderr, refused.stderr
        assert "chat: 0.0 of 14 days of history" in refused.stderr, refused.stderr
        out = cli(url, "learn", "status", timeout_s=60)
        assert "demand forecasts: mode shadow (demoted by" in out.stdout, out.stdout
        assert ": a rehearsal)" in out.stdout, out.stdout
    finally:
        server.stop()
