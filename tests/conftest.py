from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The tests mirror src/gpupool/; what several of them use (a server in a subprocess, a
# browser, PostgreSQL, shared scenario runs) lives in tests/support/, imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from gpupool.server.store import Store

_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "shared" / "traces",
    Path("/work/shared/traces"),
)


def shared_traces() -> Path | None:
    for p in _CANDIDATES:
        if p.is_dir():
            return p
    return None


SHARED_RUNS = {
    "test_api_fuzz.py": "api-fuzz",
    "test_dashboard_browser.py": "dashboard-browser",
    "test_fgd_keys.py": "fgd-keys",
    "test_grafana_dashboard.py": "grafana-dashboard",
    "test_learning_ordering.py": "learning-ordering",
    "test_loadgen.py": "loadgen",
    "test_metrics_promtool.py": "metrics-promtool",
    "test_parity_all.py": "parity-all",
    "test_review.py": "review",
    "test_review_browser.py": "review-browser",
    "test_review_scenario.py": "review-scenario",
    "test_sim_review_source.py": "sim-review-source",
    "test_thermal_placement.py": "thermal-placement",
    # both read tests/support/scenario_runs.py's runs of the resource scenarios
    "test_resource_scenarios.py": "scenario-runs",
    "test_scenario_figures.py": "scenario-runs",
}
"""Test modules whose tests share what a module-scoped fixture (or a cache) made once - a
server, a browser, a simulation - and the group each runs in under xdist (`make test` runs
`pytest -n N --dist loadgroup`): a group runs on one worker, so it is made once. A module
not listed has its tests spread over the workers one by one; list a module here when its
tests share something costly."""


def _group(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its module's group, or itself."""
    path = nodeid.split("::", 1)[0]
    group = SHARED_RUNS.get(path.rpartition("/")[2])
    return group or nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by SHARED_RUNS: xdist's own loadgroup reads xdist_group marks
    through a node id that pytest 9 no longer lets it change, so the groups are given to
    its scope scheduling here. Work goes out in collection order, one unit at a time."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # keep the slow tests first
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules (and groups) with a slow test first: the workers take tests in this
    order, and a long test started last would leave the other workers idle at the end.
    Modules move whole: the order of a module's own tests is kept (some share state).
    Tests that need a Ray cluster (tests/ray, and whatever is marked `ray_cluster`) are
    skipped outside a loopback-only network namespace, or fail the run with
    GPUPOOL_REQUIRE_RAY=1."""
    _ray_needs_netns(items)

    def unit(item: pytest.Item) -> str:
        group = _group(item.nodeid)
        return group if group != item.nodeid else item.nodeid.split("::", 1)[0]

    first: dict[str, int] = {}
    slow: set[str] = set()
    for i, item in enumerate(items):
        first.setdefault(unit(item), i)
        if item.get_closest_marker("slow") is not None:
            slow.add(unit(item))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (unit(it) not in slow, first[unit(it)], order[id(it)]))


RAY_HOW = (
    "Ray tests need a loopback-only network namespace: RAY_USAGE_STATS_ENABLED=0 "
    "unshare -n sh -c 'ip link set lo up && exec \"$@\"' sh .venv/bin/pytest -m ray_cluster "
    "tests/ray tests/e2e/test_pool_e2e.py"
)


def _loopback_only() -> bool:
    """Only `lo` in this process's network namespace. socket.if_nameindex() asks the
    kernel for our own namespace; /sys/class/net would show the namespace sysfs was
    mounted in, which `unshare -n` does not remount."""
    try:
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def _ray_needs_netns(items: list[pytest.Item]) -> None:
    ray_dir = str(Path(__file__).parent / "ray") + os.sep
    ours = [
        item
        for item in items
        if str(item.path).startswith(ray_dir) or item.get_closest_marker("ray_cluster")
    ]
    if not ours or _loopback_only():
        return
    if os.environ.get("GPUPOOL_REQUIRE_RAY") == "1":
        why = "GPUPOOL_REQUIRE_RAY=1 but not in a loopback-only netns. "
        raise pytest.UsageError(why + RAY_HOW)
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=RAY_HOW))


@pytest.fixture(scope="session")
def traces() -> Path:
    found = shared_traces()
    if found is None:
        pytest.skip("shared/traces is not beside the repository")
    return found


@pytest.fixture
def open_store(url: str) -> Iterator[Callable[[], Store]]:
    """Stores on the test module's database (its `url` fixture), all closed at teardown:
    PostgreSQL counts connections."""
    stores: list[Store] = []

    def make() -> Store:
        stores.append(Store(url))
        return stores[-1]

    yield make
    for s in stores:
        s.close()


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test() -> Iterator[None]:
    """What a test's `gpupool serve` processes left running ends with the test."""
    yield
    from service_proc import reap_left_jobs

    reap_left_jobs()
