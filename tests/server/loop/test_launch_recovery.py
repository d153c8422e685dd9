"""A launch cannot double: SIGKILLs aimed at the launch window on PostgreSQL (on SQLite, for
both executors: tests/ray/test_pool_e2e.py), and a shim killed while the scheduler is
down, never leave two live copies of one job.

Each job takes an exclusive flock on its own lock file for as long as any of its
processes lives, and writes DOUBLE to the marker file if it cannot: the count of
DOUBLE lines is the count of moments two copies of a job ran at once. Each job also
writes one RUN line per start, so the count of copies of each attempt is known too.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import containment
from containment import open_dir  # noqa: F401
from gpupool.server.agent.processes import read_start_ticks
from launch_kills import job_command, marker_lines, sigkills_around_launches
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import HTTP, Server, wait_for

SUPPORT = Path(__file__).resolve().parents[2] / "support"


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:  # noqa: F811
    yield fresh_schema(pg_url)


@pytest.mark.slow
def test_sigkills_in_the_launch_window_on_postgresql(
    open_dir: Path,  # noqa: F811
    pg_schema: str,
) -> None:
    containment.require()
    (open_dir / "state").mkdir()
    seen = sigkills_around_launches(open_dir, pg_schema, kills=10, seed=7)
    print(seen)


def _shims_under(state: Path) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpupool.server.executors.shim" in cmdline and any(
            str(state).encode() in a for a in cmdline
        ):
            found.append(int(name))
    return found


def test_a_shim_killed_while_the_server_is_down_gives_no_second_copy(
    open_dir: Path,  # noqa: F811
) -> None:
    containment.require()
    state, shared = open_dir / "state", open_dir / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    args = ("--fake-gpus", "1xA100-80GB", "--auth", "none", "--cycle", "0.2")
    server = Server(state, *args, isolation=True).start()
    try:
        body = {
            "command": list(job_command(shared, 60, 0.1)),
            "team": "research",
            "name": "long",
            "max_retries": 3,
        }
        job_id = HTTP.post(f"{server.url}/v1/jobs", json=body).json()["id"]
        wait_for(lambda: any(ln[0] == "RUN" for ln in marker_lines(shared)), 30, "the job")
    finally:
        server.kill()
    [shim] = _shims_under(state)
    [first] = [int(ln[3]) for ln in marker_lines(shared) if ln[0] == "RUN"]
    first_ticks = read_start_ticks(first)
    os.kill(shim, signal.SIGKILL)  # the job itself keeps running, shimless
    time.sleep(0.2)
    assert first_ticks is not None and read_start_ticks(first) == first_ticks
    server = Server(state, *args, isolation=True).start()
    try:
        url = f"{server.url}/v1/jobs/{job_id}"
        wait_for(lambda: HTTP.get(url).json()["state"] == "succeeded", 60, "the second attempt")
        job = HTTP.get(url).json()
        events = HTTP.get(f"{server.url}/v1/events", params={"after": 0}).json()["events"]
    finally:
        server.stop()
    lines = marker_lines(shared)
    assert [ln[0] for ln in lines] == ["RUN", "RUN"], lines
    assert [ln[2] for ln in lines] == ["1", "2"]
    assert job["attempts"] == 2
    assert read_start_ticks(first) != first_ticks  # gone (a zombie at most, or reused)
    lost = [e for e in events if e.get("job_id") == job_id and "lost" in e["message"]]
    assert lost, events
