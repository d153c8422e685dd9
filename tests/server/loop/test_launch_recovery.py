"""A launch cannot double: SIGKILLs aimed at the launch window, and a shim killed while the
scheduler is down, never leave two live copies of one job.

Each job takes an exclusive flock on its own lock file for as long as any of its
processes lives, and writes DOUBLE to the marker file if it cannot: the count of
DOUBLE lines is the count of moments two copies of a job ran at once. Each job also
writes one RUN line per start, so the count of copies of each attempt is known too.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import containment
from containment import open_dir  # noqa: F401
from gpupool.server.agent.processes import read_start_ticks
from gpupool.server.store import TERMINAL, NewJob, Store
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import Server, wait_for

SUPPORT = Path(__file__).resolve().parents[2] / "support"

JOB = (
    'exec 9>>"$1/lock-$GPUPOOL_JOB_ID"; '
    'flock -n 9 || echo "DOUBLE $GPUPOOL_JOB_ID $GPUPOOL_ATTEMPT $$" >> "$1/marker"; '
    'echo "RUN $GPUPOOL_JOB_ID $GPUPOOL_ATTEMPT $$" >> "$1/marker"; '
    'if [ "$GPUPOOL_ATTEMPT" = 1 ]; then sleep "$2"; else sleep "$3"; fi'
)


def job_command(shared: Path, first_s: float, later_s: float) -> tuple[str, ...]:
    return ("/bin/sh", "-c", JOB, "sh", str(shared), str(first_s), str(later_s))


def marker_lines(shared: Path) -> list[list[str]]:
    path = shared / "marker"
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


class Zygote:
    """tests/support/service_zygote.py: forks a fresh scheduler on demand (see its docstring)."""

    def __init__(self, state: Path, url: str, log: Path) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "service_zygote.py"), str(state), url, "on"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def start(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("start\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _intents(state: Path) -> set[Path]:
    return set((state / "jobs").glob("*/launch-*.json"))


def sigkills_around_launches(base: Path, url: str, kills: int, seed: int) -> dict[str, int]:
    """`kills` SIGKILLs of the scheduler at random moments while it launches jobs, then
    one last scheduler runs everything to the end. Returns what happened, in counts."""
    rng = random.Random(seed)
    state, shared = base / "state", base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # the team's user writes the marker and its locks here
    store = Store(url)
    store.migrate()
    zygote = Zygote(state, url, base / "zygote.log")
    ids: list[int] = []
    try:

        def submit() -> None:
            job = NewJob(
                name=f"j{len(ids)}",
                team="research",
                kind="batch",
                priority=50,
                gpu_count=1,
                command=job_command(shared, rng.uniform(0.1, 0.4), 0.05),
                grace_s=5.0,
                max_retries=50,
            )
            ids.append(store.jobs.submit(job, time.time())[0].id)

        for k in range(kills):
            known = _intents(state)
            pid = zygote.start()
            if k % 2 == 0:  # aimed: just after a launch intent appears
                submit()
                submit()
                until = time.monotonic() + 3.0
                while not _intents(state) - known and time.monotonic() < until:
                    time.sleep(0.001)
                time.sleep(rng.uniform(0.0, 0.03))
            else:  # anywhere: recovery, ingest, launches, exits
                until = time.monotonic() + rng.uniform(0.05, 1.2)
                while time.monotonic() < until:
                    if rng.random() < 0.5 and len(ids) < 2 * kills:
                        submit()
                    time.sleep(rng.uniform(0.0, 0.15))
            _kill(pid)
        last = zygote.start()

        def all_ended() -> bool:
            return all(store.jobs.get(i).state in TERMINAL for i in ids)

        wait_for(all_ended, 120, "every job to end after the last restart")
        _kill(last)
        rows = [store.jobs.get(i) for i in ids]
        events = store.events.after(0, limit=100_000)
    finally:
        zygote.close()
        store.close()
    lines = marker_lines(shared)
    doubles = [ln for ln in lines if ln[0] == "DOUBLE"]
    copies = collections.Counter((ln[1], ln[2]) for ln in lines if ln[0] == "RUN")
    assert doubles == [], f"two live copies of a job: {doubles}"
    assert max(copies.values(), default=1) == 1, [k for k, n in copies.items() if n > 1]
    states = collections.Counter(r.state for r in rows)
    failed = [(r.id, r.state, r.reason) for r in rows if r.state != "succeeded"]
    assert states == {"succeeded": len(ids)}, (failed, (base / "zygote.log").read_text()[-3000:])
    return {
        "kills": kills,
        "jobs": len(ids),
        "starts": sum(copies.values()),
        "restarted_attempts": sum(1 for r in rows if r.attempts > 1),
        "adopted_by_intent": sum("launch intent" in e.message for e in events),
        "lost": sum(e.message.startswith("lost") for e in events),
    }


@pytest.mark.slow
def test_sigkills_in_the_launch_window_never_run_a_job_twice(
    open_dir: Path,  # noqa: F811
) -> None:
    containment.require()
    url = f"sqlite:///{open_dir / 'state' / 'gpupool.db'}"
    (open_dir / "state").mkdir()
    seen = sigkills_around_launches(open_dir, url, kills=24, seed=20261201)
    print(seen)
    assert seen["jobs"] >= 24 and seen["starts"] >= seen["jobs"]
    assert seen["lost"] + seen["adopted_by_intent"] > 0  # some kills did land in a launch


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
        job_id = httpx.post(f"{server.url}/v1/jobs", json=body).json()["id"]
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
        wait_for(lambda: httpx.get(url).json()["state"] == "succeeded", 60, "the second attempt")
        job = httpx.get(url).json()
        events = httpx.get(f"{server.url}/v1/events", params={"after": 0}).json()["events"]
    finally:
        server.stop()
    lines = marker_lines(shared)
    assert [ln[0] for ln in lines] == ["RUN", "RUN"], lines
    assert [ln[2] for ln in lines] == ["1", "2"]
    assert job["attempts"] == 2
    assert read_start_ticks(first) != first_ticks  # gone (a zombie at most, or reused)
    lost = [e for e in events if e.get("job_id") == job_id and "lost" in e["message"]]
    assert lost, events
