"""A node is read as lost after `telemetry_miss_limit` missed answers in a row, not one.

`MissCounter` alone, the --config key, and `RayTelemetry` over a fake `ray` module (no Ray
cluster: its actors are in-process objects whose calls land when the test lets them).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.main import main
from gpupool.errors import SpecError
from gpupool.ports.telemetry.base import GpuSample
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.main import load_service_config
from gpupool.server.telemetry.misses import (
    DEFAULT_MISS_LIMIT,
    MissCounter,
    load_miss_limit,
    parse_miss_limit,
)
from gpupool.server.telemetry.ray import RayTelemetry


def readings(util: float, at_s: float = 1.0) -> list[GpuSample]:
    tele = FakeTelemetry("2xA100-80GB")
    tele.set_load(0, util, 1024)
    return tele.sample(at_s)


# ---- MissCounter -------------------------------------------------------------------------


def test_the_last_answer_stands_in_until_the_limit_then_the_node_is_lost() -> None:
    c = MissCounter(3)
    first = readings(80.0)
    assert c.answered(first) == first
    kept = c.missed(2.0)
    assert kept is not None and c.misses == 1
    assert [s.at_s for s in kept] == [2.0, 2.0]  # stamped this round
    assert [s.util_pct for s in kept] == [80.0, 0.0]  # the values of the last answer
    assert [s.healthy for s in kept] == [True, True]
    assert kept == [dataclasses.replace(s, at_s=2.0) for s in first]
    assert c.missed(3.0) is not None and c.misses == 2
    assert c.missed(4.0) is None and c.misses == 3  # the third in a row: lost
    assert c.missed(5.0) is None  # and lost it stays


def test_one_answer_starts_the_count_over() -> None:
    c = MissCounter(2)
    c.answered(readings(10.0))
    assert c.missed(2.0) is not None
    second = readings(20.0, at_s=3.0)
    assert c.answered(second) == second and c.misses == 0
    kept = c.missed(4.0)
    assert kept is not None and [s.util_pct for s in kept] == [20.0, 0.0]  # the newer answer
    assert c.missed(5.0) is None


def test_a_node_that_never_answered_is_lost_at_once() -> None:
    assert MissCounter(5).missed(1.0) is None


def test_a_limit_of_one_is_todays_drain_at_the_first_miss() -> None:
    c = MissCounter(1)
    c.answered(readings(10.0))
    assert c.missed(2.0) is None


def test_a_limit_under_one_is_refused() -> None:
    with pytest.raises(SpecError, match="telemetry_miss_limit must be at least 1, got 0"):
        MissCounter(0)


# ---- the --config key --------------------------------------------------------------------


def test_the_key_defaults_to_three_and_takes_a_whole_number(tmp_path: Path) -> None:
    assert DEFAULT_MISS_LIMIT == 3 == LiveConfig(tmp_path).telemetry_miss_limit
    assert parse_miss_limit(None, "f.yaml") == 3
    assert parse_miss_limit(5, "f.yaml") == 5
    assert load_miss_limit(None) == 3
    path = tmp_path / "service.yaml"
    path.write_text("cycle_s: 2\ntelemetry_miss_limit: 4\n", encoding="utf-8")
    assert load_miss_limit(path) == 4
    # the scheduling parser takes the file with the key beside its own keys
    assert load_service_config(path, LIVE_DEFAULTS).cycle_s == 2.0


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_a_bad_limit_names_the_file_and_the_key(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "service.yaml"
    path.write_text(f"telemetry_miss_limit: {bad!r}\n".replace("'", '"'), encoding="utf-8")
    with pytest.raises(SpecError) as err:
        load_miss_limit(path)
    assert str(path) in str(err.value)
    assert "telemetry_miss_limit must be a whole number of missed telemetry answers" in str(
        err.value
    )


def test_serve_refuses_a_bad_limit_before_it_opens_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "service.yaml"
    path.write_text("telemetry_miss_limit: 0\n", encoding="utf-8")
    argv = ["serve", "--config", str(path), "--state-dir", str(tmp_path / "state")]
    assert main([*argv, "--auth", "none", "--fake-gpus", "1xA100-80GB"]) == 2
    assert "telemetry_miss_limit must be a whole number" in capsys.readouterr().err
    assert not (tmp_path / "state" / "gpupool.db").exists()


# ---- RayTelemetry over a fake ray ----------------------------------------------------------


class GetTimeoutError(Exception):
    pass


class RayActorError(Exception):
    pass


class Ref:
    """A call's result: ready once its actor is not silent (a stuck call lands later)."""

    def __init__(self, actor: FakeActor, value: Any) -> None:
        self.actor, self.value = actor, value

    @property
    def ready(self) -> bool:
        return not self.actor.silent


class Method:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> Ref:
        return Ref(self.actor, getattr(self.actor.tele, self.name)(*args))


class NodeTele(FakeTelemetry):
    """What a node's actor answers (NodeTelemetryActor's methods, on a fake fleet)."""

    def source(self) -> str:
        return "fake"


class FakeActor:
    """A node's telemetry actor in-process; `silent`: its calls do not land (yet)."""

    def __init__(self, node: str, model: str, count: int) -> None:
        self.tele = NodeTele(f"{count}x{model}")
        self.silent = False

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)


class FakeRay:
    """What RayTelemetry uses of `ray`: remote, get_actor, get, wait, kill."""

    def __init__(self) -> None:
        self.actors: dict[str, FakeActor] = {}

    def remote(self, cls: Any) -> Any:
        ray = self

        class Cls:
            def options(self, **kw: Any) -> Any:
                return self

            def remote(self, node: str, model: str, count: int) -> FakeActor:
                actor = FakeActor(node, model, count)
                ray.actors[node] = actor
                return actor

        return Cls()

    def get_actor(self, name: str, namespace: str) -> Any:
        raise ValueError(f"no actor {name}")

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [self.get(r, timeout) for r in ref]
        if not ref.ready:
            raise GetTimeoutError("timed out")
        return ref.value

    def wait(
        self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Ref], list[Ref]]:
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def kill(self, actor: Any) -> None:
        pass


@pytest.fixture()
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    ray = FakeRay()
    mod = types.ModuleType("ray")
    for name in ("remote", "get_actor", "get", "wait", "kill"):
        setattr(mod, name, getattr(ray, name))
    exceptions = types.ModuleType("ray.exceptions")
    exceptions.RayActorError = RayActorError  # type: ignore[attr-defined]
    util = types.ModuleType("ray.util")
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.NodeAffinitySchedulingStrategy = lambda *a, **kw: None  # type: ignore[attr-defined]
    for name, module in (
        ("ray", mod),
        ("ray.exceptions", exceptions),
        ("ray.util", util),
        ("ray.util.scheduling_strategies", strategies),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    yield ray


FLEET = [("a", "A100-80GB", 2), ("b", "H100-80GB", 1)]
IDS = {"a": "ray-a", "b": "ray-b"}


def test_a_silent_node_keeps_its_last_reading_until_the_limit(fake_ray: FakeRay) -> None:
    tele = RayTelemetry(FLEET, IDS, miss_limit=3)
    assert tele.sources() == {"a": "fake", "b": "fake"}
    tele.set_load(1, 80.0, 2048)
    first = tele.sample(10.0)
    assert [s.healthy for s in first] == [True, True, True]
    assert first[1].util_pct == 80.0

    fake_ray.actors["a"].silent = True
    for now in (11.0, 12.0):  # two misses: node a's last reading stands in
        got = tele.sample(now)
        assert [s.healthy for s in got] == [True, True, True], [s.problem for s in got]
        assert [s.at_s for s in got] == [now] * 3
        assert got[1].util_pct == 80.0 and got[1].mem_used_mib == 2048
    lost = tele.sample(13.0)  # the third in a row: node a's GPUs read lost, b's do not
    assert [s.healthy for s in lost] == [False, False, True]
    assert lost[0].problem.startswith("node a: telemetry actor unreachable (no answer within 2 s)")
    assert "3 answers missed in a row (telemetry_miss_limit 3)" in lost[0].problem
    assert lost[1].util_pct == 0.0  # a lost GPU shows no load

    fake_ray.actors["a"].silent = False  # the stuck call lands: node a is back at once
    back = tele.sample(14.0)
    assert [s.healthy for s in back] == [True, True, True]
    assert back[0].at_s == 11.0  # read when it was asked, in the first missed round

    fake_ray.actors["a"].silent = True  # the count started over: two more rounds kept
    assert all(s.healthy for s in tele.sample(15.0))
    assert all(s.healthy for s in tele.sample(16.0))
    assert [s.healthy for s in tele.sample(17.0)] == [False, False, True]
    tele.close()


def test_a_limit_of_one_drains_at_the_first_missed_answer(fake_ray: FakeRay) -> None:
    tele = RayTelemetry(FLEET, IDS, miss_limit=1)
    assert all(s.healthy for s in tele.sample(1.0))
    fake_ray.actors["b"].silent = True
    got = tele.sample(2.0)
    assert [s.healthy for s in got] == [True, True, False]
    assert got[2].problem.startswith("node b: telemetry actor unreachable")
    assert "in a row" not in got[2].problem


def test_a_node_silent_from_the_start_reads_lost_at_once(fake_ray: FakeRay) -> None:
    class Silent(FakeRay):
        def remote(self, cls: Any) -> Any:
            made = super().remote(cls)
            inner = made.remote

            def remote(node: str, model: str, count: int) -> FakeActor:
                actor = inner(node, model, count)
                actor.silent = node == "b"
                return actor

            made.remote = remote
            return made

    silent = Silent()
    sys.modules["ray"].remote = silent.remote  # type: ignore[attr-defined]
    tele = RayTelemetry(FLEET, IDS, miss_limit=3, start_timeout_s=0.01)
    got = tele.sample(1.0)
    assert [s.healthy for s in got] == [True, True, False]
    assert got[2].problem.startswith("node b: telemetry actor unreachable")


def test_ray_telemetry_refuses_a_limit_under_one(fake_ray: FakeRay) -> None:
    with pytest.raises(SpecError, match="telemetry_miss_limit must be at least 1"):
        RayTelemetry(FLEET, IDS, miss_limit=0)
