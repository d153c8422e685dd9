"""SIGKILLs aimed at a scheduler's launch windows, and the count of double runs they caused.

Each job takes an exclusive flock on its own lock file for as long as any of its
processes lives, and writes DOUBLE to the marker file if it cannot: the count of
DOUBLE lines is the count of moments two copies of a job ran at once. Each job also
writes one RUN line per start, so the count of copies of each attempt is known too.
The scheduler is tests/support/service_zygote.py's child (the local executor, or with a
Ray address the Ray executor on that cluster's nodes)."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpupool.server.store import TERMINAL, NewJob, Store
from service_proc import wait_for

SUPPORT = Path(__file__).resolve().parent

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

    def __init__(self, state: Path, url: str, log: Path, ray_address: str = "") -> None:
        self.log = log.open("ab")
        extra = [ray_address] if ray_address else []
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "service_zygote.py"), str(state), url, "on", *extra],
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


def _window_marks(store: Store) -> tuple[int, int]:
    """The marks of kills that came inside a launch window, from the events: (attempts
    re-adopted by their launch intent, launches lost)."""
    events = store.events.after(0, limit=100_000)
    adopted = sum("launch intent" in e.message for e in events)
    return adopted, sum(e.message.startswith("lost") for e in events)


def sigkills_around_launches(
    base: Path,
    url: str,
    kills: int,
    seed: int,
    ray_address: str = "",
    window_s: float = 0.03,
    end_s: float = 120.0,
    intent_wait_s: float = 3.0,
) -> dict[str, int]:
    """`kills` SIGKILLs of the scheduler at random moments while it launches jobs (every
    other one within `window_s` of a launch intent appearing; then up to `kills` more aimed
    ones, each followed by a recovery that is killed too, until one has landed in a launch
    window), then one last scheduler runs everything to
    the end (within `end_s`). Returns what happened, in counts."""
    rng = random.Random(seed)
    state, shared = base / "state", base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # the team's user writes the marker and its locks here
    store = Store(url)
    store.migrate()
    zygote = Zygote(state, url, base / "zygote.log", ray_address)
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

        def aimed() -> None:
            """Kill just after a launch intent appears."""
            known = _intents(state)
            pid = zygote.start()
            submit()
            submit()
            until = time.monotonic() + intent_wait_s
            while not _intents(state) - known and time.monotonic() < until:
                time.sleep(0.001)
            time.sleep(rng.uniform(0.0, window_s))
            _kill(pid)

        for k in range(kills):
            if k % 2 == 0:
                aimed()
                continue
            pid = zygote.start()  # anywhere: recovery, ingest, launches, exits
            until = time.monotonic() + rng.uniform(0.05, 1.2)
            while time.monotonic() < until:
                if rng.random() < 0.5 and len(ids) < 2 * kills:
                    submit()
                time.sleep(rng.uniform(0.0, 0.15))
            _kill(pid)
        # On a loaded machine the aimed kills can all come after the launch was recorded;
        # then aim more (bounded) until one has landed inside a launch window. A kill's mark
        # (an adopted intent or a lost launch) is written by the scheduler started next.
        made = kills
        for _ in range(kills):
            if any(_window_marks(store)):
                break
            aimed()
            pid = zygote.start()
            until = time.monotonic() + 3.0
            while not any(_window_marks(store)) and time.monotonic() < until:
                time.sleep(0.05)
            _kill(pid)
            made += 2
        last = zygote.start()

        def all_ended() -> bool:
            return all(store.jobs.get(i).state in TERMINAL for i in ids)

        wait_for(all_ended, end_s, "every job to end after the last restart")
        _kill(last)
        rows = [store.jobs.get(i) for i in ids]
        adopted, lost = _window_marks(store)
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
        "kills": made,
        "jobs": len(ids),
        "starts": sum(copies.values()),
        "restarted_attempts": sum(1 for r in rows if r.attempts > 1),
        "adopted_by_intent": adopted,
        "lost": lost,
    }
