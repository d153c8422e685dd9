from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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
