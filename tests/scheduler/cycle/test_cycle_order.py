"""The cycle's stages are plug-ins: one order, in one place, each stage once; no stage
reaches for the Scheduler; an event the core does not know cannot fall into another's
branch."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from gpupool.domain.model import Cluster, Node
from gpupool.scheduler import Scheduler, SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext, Published
from gpupool.scheduler.cycle.order import EVERY_CALL, EVERY_CYCLE
from gpupool.scheduler.events import Event

SCHEDULER = Path(__file__).resolve().parents[3] / "src" / "gpupool" / "scheduler"


def core(**config: object) -> Scheduler:
    nodes = tuple(Node(f"n{i}", "H100", 8, 1 << 20, 1 << 30) for i in range(2))
    return Scheduler(Cluster("c", nodes), SchedulerConfig(**config))  # type: ignore[arg-type]


def test_each_stage_has_one_place_in_the_order_and_its_own_name() -> None:
    stages = EVERY_CALL + EVERY_CYCLE
    assert len(set(stages)) == len(stages)
    names = [s.name for s in stages]
    assert len(set(names)) == len(names), names


def test_the_core_runs_its_stages_in_the_order_of_order_py() -> None:
    s = core()
    ranks = {t: k for k, t in enumerate(EVERY_CYCLE)}
    built = [ranks[type(stage)] for stage in s.every_cycle]
    assert built == sorted(built)
    assert [type(stage) for stage in s.every_call] == list(EVERY_CALL)


def test_stages_the_configuration_does_not_want_are_not_built() -> None:
    plain = {type(st).__name__ for st in core().every_cycle}
    assert "PriceDeferral" not in plain and "PowerCaps" not in plain
    assert "CloudBurst" not in plain and "LearningTick" not in plain
    from gpupool.scheduler.config import EnergyConfig

    priced = {type(st).__name__ for st in core(energy=EnergyConfig(power_capping=True)).every_cycle}
    assert "PowerCaps" in priced


def test_a_stage_runs_on_its_context_and_returns_commands() -> None:
    s = core()
    ctx = CycleContext(0.0, None, [], Published())
    for stage in s.every_call + s.every_cycle:
        out = stage.run(ctx)
        assert isinstance(out, list)
        ctx.out.extend(out)


def test_no_stage_imports_the_scheduler() -> None:
    """Stages get their collaborators, never the Scheduler (that made the import cycles)."""
    offenders = []
    for path in sorted(SCHEDULER.rglob("*.py")):
        if path.name in ("scheduler.py", "__init__.py") and path.parent == SCHEDULER:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "gpupool.scheduler.scheduler":
                offenders.append(str(path.relative_to(SCHEDULER)))
            if isinstance(node, ast.ImportFrom) and node.module == "gpupool.scheduler":
                offenders.append(str(path.relative_to(SCHEDULER)))
    assert offenders == []


def test_every_event_type_has_its_own_branch_and_an_unknown_one_fails() -> None:
    source = (SCHEDULER / "scheduler.py").read_text()
    observe = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "observe"
    )
    cases = {
        c.pattern.cls.id
        for n in ast.walk(observe)
        if isinstance(n, ast.match_case)
        for c in [n]
        if isinstance(c.pattern, ast.MatchClass) and isinstance(c.pattern.cls, ast.Name)
    }
    assert cases == {t.__name__ for t in get_args(Event)}
    with pytest.raises(AssertionError):
        core().observe(object())  # type: ignore[arg-type]
