"""The architecture, kept: the folders are the layers, and this test fails on what breaks them.

It reads the package's source (no import of it) and fails on:
* an import cycle between modules, type-level and deferred imports included;
* a module over 800 lines (alembic migrations aside);
* a private name (`_x`) imported from another module, or a private attribute used on an
  object where the module using it defines no such name (another module's internals);
* a layer violation: the decision core (`domain`, `policies`, `scheduler`) and the models
  it uses import no driver; the ports import no driver; the server imports no simulator
  and the simulator no server module; nothing but the simulator and the command line
  imports the simulator.

There are no exceptions: a rule that must bend is a design change, to be made here and in
docs/ARCHITECTURE.md with its reason.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "gpupool"
MAX_LINES = 800

# Private attributes of the standard library and of libraries that are theirs to use:
# namedtuple's API, os._exit, SQLAlchemy's Row._mapping.
LIBRARY_PRIVATE_ATTRS = frozenset(
    {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_mapping"}
)

# Layers, lowest first. A package may import its own layer and those below, never above.
DRIVERS = ("gpupool.server", "gpupool.sim", "gpupool.cli", "gpupool.service")
CORE = ("gpupool.domain", "gpupool.policies", "gpupool.scheduler")
MODELS = (
    "gpupool.energy",
    "gpupool.federation",
    "gpupool.learning",
    "gpupool.sizing",
    "gpupool.traces",
    "gpupool.reports",
)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(), str(self.path))


def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        if "migrations" in path.relative_to(SRC).parts:
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


MODULES = modules()


def _base(mod: Module, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    parts = mod.name.split(".")
    if not mod.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _owner(name: str) -> str | None:
    """The module that defines `name` (a module, or a name in a module)."""
    while name and name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name or None


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    name: str | None
    line: int


def imports(mod: Module) -> Iterator[Import]:
    """Every import of a gpupool module, wherever it stands (TYPE_CHECKING, functions)."""
    for node in ast.walk(mod.tree()):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    target = _owner(alias.name)
                    if target is not None:
                        yield Import(mod.name, target, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _base(mod, node)
            if base is None or base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    yield Import(mod.name, full, None, node.lineno)
                else:
                    target = _owner(base)
                    if target is not None:
                        yield Import(mod.name, target, alias.name, node.lineno)


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES.values():
        for imp in imports(mod):
            if imp.target != mod.name:
                graph[mod.name].add(imp.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(MODULES):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _defined_names(tree: ast.Module) -> set[str]:
    """Every name a module defines or binds: functions, classes, attributes it assigns,
    parameters and keywords (a private name it owns)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names.add(node.arg)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_crossings() -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for mod in MODULES.values():
        tree = mod.tree()
        for imp in imports(mod):
            if imp.name is not None and _private(imp.name) and imp.target != mod.name:
                found.append((mod.name, f"imports {imp.name} from {imp.target}"))
        own = _defined_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own or node.attr in LIBRARY_PRIVATE_ATTRS:
                continue
            found.append((mod.name, f"uses another module's .{node.attr}"))
    return sorted(set(found))


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def layer_violations() -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for mod in MODULES.values():
        for imp in imports(mod):
            src, dst = mod.name, imp.target
            why = None
            if _in(src, ("gpupool.domain",)) and not _in(dst, ("gpupool.domain", "gpupool.errors")):
                why = "the domain imports only itself and gpupool.errors"
            elif _in(src, CORE + MODELS) and _in(dst, (*DRIVERS, "gpupool.ports")):
                why = "the decision core and its models import no driver and no port"
            elif _in(src, ("gpupool.ports",)) and _in(dst, DRIVERS):
                why = "the ports sit below both drivers"
            elif _in(src, ("gpupool.server",)) and _in(dst, ("gpupool.sim", "gpupool.cli")):
                why = "the server imports no simulator and no command line"
            elif _in(src, ("gpupool.sim",)) and _in(dst, ("gpupool.server", "gpupool.cli")):
                why = "the simulator imports no server module and no command line"
            elif _in(dst, ("gpupool.sim",)) and not _in(src, ("gpupool.sim", "gpupool.cli")):
                why = "only the simulator and the command line import the simulator"
            if why is not None:
                found.append((src, dst, why))
    return sorted(set(found))


def oversized() -> list[tuple[str, ...]]:
    found = []
    for mod in MODULES.values():
        lines = len(mod.path.read_text().splitlines())
        if lines > MAX_LINES:
            found.append((mod.name,))
    return sorted(found)


def test_the_package_is_found() -> None:
    """The rules below read something: the package is where this test looks for it."""
    assert "gpupool.scheduler.scheduler" in MODULES
    assert len(MODULES) > 100


def _none(found: list[tuple[str, ...]], advice: str) -> None:
    assert not found, f"{advice}:\n" + "\n".join(" ".join(row) for row in found)


def test_no_import_cycles() -> None:
    _none([tuple(c) for c in cycles(import_graph())], "import cycles")


def test_no_module_over_800_lines() -> None:
    _none(oversized(), "split these by concern (at most 800 lines)")


def test_no_private_name_crosses_a_module() -> None:
    _none(private_crossings(), "make these public or move them")


def test_layers() -> None:
    _none(layer_violations(), "layer violations")


# ---- the checks check something ------------------------------------------------------------
def test_cycles_are_found_type_level_and_deferred_ones_included(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    global MODULES
    saved = MODULES
    MODULES = {n: Module(n, tmp_path, False) for n in "abcd"}
    try:
        assert cycles(graph) == [["a", "b", "c"]]
    finally:
        MODULES = saved
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gpupool.scheduler.scheduler import Scheduler\n"
        "def f():\n    from gpupool.server.store import _x\n    return obj._secret\n"
    )
    path = tmp_path / "m.py"
    path.write_text(code)
    mod = Module("gpupool.fake", path, False)
    got = {(i.target, i.name) for i in imports(mod)}
    assert ("gpupool.scheduler.scheduler", "Scheduler") in got
    assert ("gpupool.server.store", "_x") in got


@pytest.mark.parametrize(
    ("source", "private"),
    [
        ("self._x = 1\nprint(other._x)\n", False),
        ("print(other._hidden)\n", True),
        ("print(row._mapping, t._replace())\n", False),
    ],
)
def test_private_attribute_rule(tmp_path: Path, source: str, private: bool) -> None:
    tree = ast.parse(source)
    own = _defined_names(tree)
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and _private(n.attr)
        and n.attr not in own
        and n.attr not in LIBRARY_PRIVATE_ATTRS
    }
    assert bool(used) is private


if __name__ == "__main__":  # a report without pytest: python tests/test_architecture.py
    for title, rows in (
        ("cycles", [tuple(c) for c in cycles(import_graph())]),
        ("over 800 lines", oversized()),
        ("private names crossing", private_crossings()),
        ("layers", layer_violations()),
    ):
        print(f"== {title}: {len(rows)}")
        for row in rows:
            print("  ", " ".join(row))
    sys.exit(0)


def test_a_layer_violation_and_an_oversized_module_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tmp_path / "server.py"
    server.write_text("from gpupool.sim.scenario.runner import run_scenario\n" * 801)
    fake = {
        "gpupool.server.fake": Module("gpupool.server.fake", server, False),
        "gpupool.sim.scenario.runner": MODULES["gpupool.sim.scenario.runner"],
    }
    monkeypatch.setattr(sys.modules[__name__], "MODULES", fake)
    assert {row[:2] for row in layer_violations()} == {
        ("gpupool.server.fake", "gpupool.sim.scenario.runner")
    }
    assert oversized() == [("gpupool.server.fake",)]
