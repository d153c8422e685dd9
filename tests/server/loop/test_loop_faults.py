"""The scheduler loop on a bad day: it stays alive, /healthz tells the truth, nothing is lost.

In-process (a fake executor, a fake disk, a manual clock): an error in one stage or one
job costs that stage one cycle; a launch that fails for the machine is requeued and
launches back off; a disk below its floor holds launches with reason DiskFull; a job lost
again and again stops at its limit; database calls are retried.

Real servers (`gpupool serve`, fake fleet, 127.0.0.1): a SQLite write lock held 45 s by
another process, a PostgreSQL table lock, a full state tmpfs, a read-only jobs
directory, an exhausted descriptor limit, and a job that fills the state disk and is lost
on every restart. The filesystem cases mount tmpfs and need root; without it they skip,
or fail under GPUPOOL_REQUIRE_ISOLATION=1.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
import sqlalchemy.pool
from sqlalchemy.exc import IntegrityError, OperationalError

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.base import Handle, LaunchSpec
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.diskspace import MIB, DiskFloor, FakeDisk
from gpupool.server.loop.driver import LiveService
from gpupool.server.loop.health import LoopHealth
from gpupool.server.store import (
    Database,
    NewJob,
    Retry,
    RetryPolicy,
    Store,
    database_url,
)
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import HTTP, Server, free_port, wait_for

T0 = 1_000.0


# ---- in process -----------------------------------------------------------------------------
class FlakyExecutor(FakeExecutor):
    """A fake whose next launches fail with the errors queued in `fail`."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: list[BaseException] = []

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        if self.fail:
            raise self.fail.pop(0)
        return super().launch(spec, now_s)


class Rig:
    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.store = Store(database_url(None, tmp_path / "db"))
        self.store.migrate()
        self.executor = FlakyExecutor()
        self.telemetry = FakeTelemetry("1xA100-80GB")
        self.clock = ManualClock(T0)
        self.disk = FakeDisk()
        self.service = LiveService(
            LiveConfig(state_dir=tmp_path / "state", sample_s=0.0, host="h", **config),
            self.store,
            self.executor,
            self.telemetry,
            self.clock,
            disk=self.disk,
        )

    def submit(self, name: str = "j") -> int:
        job = NewJob(
            name=name,
            team="t",
            kind="training",
            priority=50,
            gpu_count=1,
            command=("python", "train.py"),
        )
        return self.store.jobs.submit(job, self.clock.now())[0].id

    def step(self) -> None:
        self.clock.advance(1.0)
        self.service.step()

    def state(self, job_id: int) -> str:
        return self.store.jobs.get(job_id).state

    def events(self, kind: str) -> list[str]:
        return [e.message for e in self.store.events.after(0, limit=10_000) if e.kind == kind]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_an_error_in_one_stage_costs_that_stage_only(rig: Rig, monkeypatch: Any) -> None:
    def broken(now_s: float) -> list[Any]:
        raise RuntimeError("the NVML library went away")

    monkeypatch.setattr(rig.telemetry, "sample", broken)
    job = rig.submit()
    rig.step()  # does not raise
    assert rig.state(job) == "running", "the cycle ran although sampling failed"
    err = rig.service.health.last_error
    assert err is not None and err.stage == "sample" and "NVML" in err.message
    assert any("sample: RuntimeError" in m for m in rig.events("loop-error"))
    assert "sample" in (rig.service.state.loop_error or "")


def test_a_job_that_cannot_be_scheduled_fails_alone(rig: Rig, monkeypatch: Any) -> None:
    bad, good = rig.submit("bad"), rig.submit("good")
    submit = rig.service.scheduler.submit

    def picky(spec: Any, *args: Any, **kw: Any) -> Any:
        if spec.job_id == str(bad):
            raise ValueError("a spec the core cannot read")
        return submit(spec, *args, **kw)

    monkeypatch.setattr(rig.service.scheduler, "submit", picky)
    rig.step()
    assert rig.state(bad) == "failed"
    assert "cannot be scheduled: ValueError" in rig.store.jobs.get(bad).reason
    assert rig.state(good) == "running"


def test_a_launch_failing_for_the_machine_is_requeued_and_launches_back_off(rig: Rig) -> None:
    rig.executor.fail = [OSError(errno.EMFILE, "Too many open files")]
    job = rig.submit()
    rig.step()
    row = rig.store.jobs.get(job)
    assert row.state == "suspended", row
    assert "could not start: OSError: [Errno 24] Too many open files" in row.reason
    rig.step()  # within the backoff: nothing is launched
    assert (rig.service.state.gate or "").startswith("LaunchFailing")
    assert rig.state(job) == "suspended"
    assert rig.executor.calls == []
    rig.service.launch_gate.launch_retry_at = 0.0  # the backoff (1 s) is over
    rig.step()
    assert rig.state(job) == "running"
    assert rig.service.state.gate is None and rig.service.launch_gate.launch_backoff_s == 0.0


def test_a_launch_failing_for_the_job_fails_it_with_the_reason(rig: Rig) -> None:
    from gpupool.errors import SpecError

    rig.executor.fail = [SpecError("working directory /nope does not exist; create it")]
    job = rig.submit()
    rig.step()
    row = rig.store.jobs.get(job)
    assert row.state == "failed" and "could not start: working directory /nope" in row.reason


def test_disk_below_its_floor_holds_launches_with_reason_diskfull(rig: Rig) -> None:
    rig.disk.free_bytes = 500 * MIB  # under the 1 GiB floor of a 200 GiB disk
    job = rig.submit()
    rig.step()
    row = rig.store.jobs.get(job)
    assert row.state == "pending" and row.reason.startswith("DiskFull:"), row
    assert rig.executor.calls == []
    view = rig.service.views.health_view()
    assert view["ok"] is True and view["launches"]["waiting"].startswith("DiskFull")
    assert view["launches"]["disk"]["free_mib"] == 500.0
    assert rig.events("launches-waiting") and rig.events("waiting")
    later = rig.submit("later")  # arrives while the disk is full: told as well
    rig.step()
    assert rig.store.jobs.get(later).reason.startswith("DiskFull:")
    rig.disk.free_bytes = 50 << 30
    rig.step()
    assert rig.state(job) == "running"
    # its own reason is given back: why it waits now that launches go on
    assert rig.store.jobs.get(later).reason.startswith("Resources: needs 1 "), rig.store.jobs.get(
        later
    )
    assert rig.events("launches-resumed")
    assert rig.service.views.health_view()["launches"]["waiting"] is None


def test_a_read_only_disk_holds_launches(rig: Rig) -> None:
    rig.disk.read_only = True
    job = rig.submit()
    rig.step()
    assert rig.store.jobs.get(job).reason.startswith("ReadOnly:")
    rig.disk.read_only = False
    rig.step()
    assert rig.state(job) == "running"


def test_floor_is_the_smaller_of_mib_and_percent() -> None:
    floor = DiskFloor(1024, 5)
    assert floor.floor_bytes(10 << 30) == int(0.05 * (10 << 30))  # 512 MiB: 5 % is smaller
    assert floor.floor_bytes(1 << 40) == 1 << 30


def test_a_job_lost_again_and_again_stops_at_its_limit(tmp_path: Path) -> None:
    rig = Rig(tmp_path, lost_retries=2)
    job = rig.submit()
    rig.step()
    for n in (1, 2):
        rig.executor.vanish(str(job))
        rig.step()  # reaped as lost, requeued and started again in the same step
        row = rig.store.jobs.get(job)
        assert row.state == "running" and row.attempts == n + 1, row
    rig.executor.vanish(str(job))
    rig.step()
    row = rig.store.jobs.get(job)
    assert row.state == "failed", row
    assert "lost 3 times, more than the limit of 2" in row.reason
    assert "--lost-retries" in row.reason
    requeues = [m for m in rig.events("suspended") if m.startswith("lost: ")]
    assert [m.rsplit("(", 1)[1] for m in requeues] == ["requeue 1 of 2)", "requeue 2 of 2)"]


def test_database_calls_are_retried_with_backoff() -> None:
    calls: list[int] = []
    retries: list[tuple[int, float]] = []

    class Flaky:
        def write(self) -> str:
            calls.append(1)
            if len(calls) < 3:
                raise OperationalError("BEGIN", {}, sqlite3.OperationalError("database is locked"))
            return "done"

        def conflict(self) -> None:
            raise IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE"))

    flaky = Flaky()
    retry = Retry(
        RetryPolicy(first_s=0.01, max_s=0.02, give_up_s=5),
        lambda err, n, delay: retries.append((n, delay)),
    )
    assert retry.call(flaky.write) == "done"
    assert retries == [(1, 0.01), (2, 0.02)]
    with pytest.raises(IntegrityError):  # not transient: raised at once
        retry.call(flaky.conflict)
    calls.clear()
    quick = Retry(RetryPolicy(first_s=0.05, max_s=0.05, give_up_s=0.01))
    with pytest.raises(OperationalError):
        quick.call(flaky.write)
    assert len(calls) == 1, "gave up: the next try would be past give_up_s"


def test_the_loops_store_retries_a_whole_call_and_the_apis_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(database_url(None, tmp_path))
    store.migrate()
    try:
        row, _ = store.jobs.submit(NewJob("j", "t", "training", 50, 1, ("true",)), T0)
        retries: list[int] = []
        loops = store.retrying(
            Retry(RetryPolicy(first_s=0.01, max_s=0.01), lambda err, n, delay: retries.append(n))
        )
        locked = OperationalError("BEGIN", {}, sqlite3.OperationalError("database is locked"))
        fails = [locked, locked]
        real = Database.read

        def flaky(self: Database) -> Any:
            if fails:
                raise fails.pop()
            return real(self)

        monkeypatch.setattr(Database, "read", flaky)
        assert loops.jobs.get(row.id) == row
        assert retries == [1, 2]
        fails.append(locked)
        with pytest.raises(OperationalError):  # the API's store answers at once
            store.jobs.get(row.id)
        assert loops.url == store.url and loops.jobs.db.retry is not None
    finally:
        store.close()


def test_health_is_late_then_dead() -> None:
    health = LoopHealth(late_after_s=0.2)
    assert health.view()["ok"] is True  # never started (tests step by hand)
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    health.started(thread)
    thread.start()
    health.completed()
    assert health.view()["ok"] is True
    time.sleep(0.3)
    late = health.view()
    assert late["ok"] is False and "has not completed a cycle" in late["problem"]
    health.dead("RuntimeError: boom")
    release.set()
    thread.join()
    dead = health.view()
    assert dead["ok"] is False and "has stopped: RuntimeError: boom" in dead["problem"]


# ---- real servers ---------------------------------------------------------------------------
def _need_root() -> None:
    if os.geteuid() == 0:
        return
    why = "mounting a tmpfs as the state directory needs root"
    if os.environ.get("GPUPOOL_REQUIRE_ISOLATION") == "1":
        pytest.fail(f"GPUPOOL_REQUIRE_ISOLATION=1 but {why}")
    pytest.skip(why)


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int, *options: str) -> Iterator[Path]:
    _need_root()
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size_mib}m", *options))
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


FAKE = ("--fake-gpus", "1xA100-80GB", "--auth", "none", "--cycle", "0.2", "--sample", "0.5")


def _health(client: httpx.Client, url: str) -> tuple[int, dict[str, Any]]:
    r = client.get(f"{url}/healthz", timeout=5)
    return r.status_code, r.json()


def _submit(url: str, command: list[str], timeout_s: float = 10, **extra: Any) -> int:
    body = {"command": command, "team": "t", "name": "j", **extra}
    r = HTTP.post(f"{url}/v1/jobs", json=body, timeout=timeout_s)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _recorded_pid(state: Path, job_id: int) -> bool:
    """Whether the launch has written the job's process to the database."""
    with contextlib.closing(sqlite3.connect(state / "gpupool.db", timeout=5)) as c:
        row = c.execute("SELECT pid FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return row is not None and row[0] is not None


def _job(url: str, job_id: int) -> dict[str, Any]:
    r = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _all_succeed(url: str, ids: list[int], timeout_s: float) -> None:
    wait_for(
        lambda: all(_job(url, i)["state"] == "succeeded" for i in ids),
        timeout_s,
        f"jobs {ids} to succeed",
    )


@pytest.mark.slow
def test_a_database_lock_held_45s_leaves_the_loop_alive_and_healthz_truthful(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    server = Server(state, *FAKE, "--health-late", "3").start()
    holder: subprocess.Popen[str] | None = None
    try:
        before = _submit(server.url, ["sleep", "2"])
        wait_for(lambda: _job(server.url, before)["state"] == "running", 15, "the first job")
        # The job is `running` before its process is recorded: lock only once the launch has
        # written the process, so the loop's first blocked write is the job's end (reap).
        wait_for(lambda: _recorded_pid(state, before), 15, "the first job's process record")
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys, time\n"
                f"c = sqlite3.connect({str(state / 'gpupool.db')!r}, isolation_level=None)\n"
                "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True)\n"
                "time.sleep(45); c.execute('ROLLBACK')",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        locked_at = time.monotonic()
        client = httpx.Client()
        # The first job ends and the loop cannot record it: its cycle is late.
        wait_for(lambda: _health(client, server.url)[0] == 503, 15, "/healthz to go 503")
        code, body = _health(client, server.url)
        assert body["ok"] is False and "not completed a cycle" in body["problem"], body
        during: list[int] = []
        # A submit waits for the lock (30 s at most): sent 20 s in, it gets through.
        time.sleep(max(0.0, 20 - (time.monotonic() - locked_at)))
        submitter = threading.Thread(
            target=lambda: during.append(_submit(server.url, ["true"], timeout_s=60))
        )
        submitter.start()
        time.sleep(max(0.0, 37 - (time.monotonic() - locked_at)))
        code, body = _health(client, server.url)
        assert code == 503 and "database is locked" in body["problem"], body
        assert body["loop"]["last_error"]["stage"] == "reap", body
        view = client.get(f"{server.url}/v1/cluster", timeout=20)  # answers, does not hang
        assert view.status_code == 503 and "scheduler loop" in view.json()["detail"], view.text
        holder.wait(30)
        wait_for(lambda: _health(client, server.url)[0] == 200, 30, "/healthz to recover")
        submitter.join(30)
        assert len(during) == 1, "the submit during the lock was not accepted"
        after = _submit(server.url, ["true"])
        _all_succeed(server.url, [before, *during, after], 30)
        body = _health(client, server.url)[1]
        assert body["loop"]["running"] and body["loop"]["errors"] >= 1
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        server.stop()


@pytest.mark.slow
def test_a_postgresql_table_lock_leaves_the_loop_alive_and_healthz_truthful(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """PostgreSQL has no busy timeout: a writer behind a lock just waits. The loop then
    completes no cycle, and /healthz says so until the lock goes."""
    db = fresh_schema(pg_url)
    server = Server(tmp_path / "state", "--db", db, *FAKE, "--health-late", "3").start()
    try:
        # The job's end is the write that waits behind the lock: it must still be running
        # when the lock is taken (a 1-s job once ended first on a loaded host, and the loop,
        # with nothing to write, stayed healthy).
        before = _submit(server.url, ["sleep", "6"])
        wait_for(lambda: _job(server.url, before)["state"] == "running", 15, "the first job")
        client = httpx.Client()
        lock = sqlalchemy.create_engine(db, poolclass=sqlalchemy.pool.NullPool).connect()
        try:
            lock.execute(sqlalchemy.text("LOCK TABLE jobs IN EXCLUSIVE MODE"))
            wait_for(lambda: _health(client, server.url)[0] == 503, 25, "/healthz to go 503")
            body = _health(client, server.url)[1]
            assert "not completed a cycle" in body["problem"], body
            assert _job(server.url, before)["state"] == "running"  # reads still answer
            time.sleep(3)
            assert _health(client, server.url)[0] == 503
        finally:
            lock.rollback()  # the lock goes with the transaction
            lock.close()
        wait_for(lambda: _health(client, server.url)[0] == 200, 15, "/healthz to recover")
        after = _submit(server.url, ["true"])
        _all_succeed(server.url, [before, after], 20)
    finally:
        server.stop()


def _fill(path: Path, leave_bytes: int = 0) -> None:
    """Write `path` until the filesystem has about `leave_bytes` left (or none)."""
    chunk = b"\0" * (256 * 1024)
    with path.open("ab") as f:
        while True:
            st = os.statvfs(path.parent)
            if st.f_bavail * st.f_frsize <= leave_bytes + len(chunk):
                break
            try:
                f.write(chunk)
                f.flush()
            except OSError as err:
                assert err.errno == errno.ENOSPC
                break


def test_a_full_state_tmpfs_holds_launches_and_resumes_them(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state", 32) as state:
        server = Server(state, *FAKE, "--disk-floor-mib", "8", "--disk-floor-pct", "100")
        server.log = tmp_path / "server.log"  # off the disk that fills
        server.start()
        client = httpx.Client()
        try:
            first = _submit(server.url, ["true"])
            _all_succeed(server.url, [first], 20)
            _fill(state / "ballast-1", leave_bytes=4 * MIB)  # below the 8 MiB floor
            wait_for(
                lambda: (_health(client, server.url)[1]["launches"]["waiting"] or "").startswith(
                    "DiskFull"
                ),
                10,
                "launches to wait with DiskFull",
            )
            waiting = _submit(server.url, ["true"])
            wait_for(
                lambda: _job(server.url, waiting)["reason"].startswith("DiskFull"),
                10,
                "the job's reason to say DiskFull",
            )
            assert _job(server.url, waiting)["state"] == "pending"
            _fill(state / "ballast-2")  # and now nothing at all is left
            accepted: list[int] = []
            with contextlib.suppress(AssertionError, httpx.HTTPError):
                accepted.append(_submit(server.url, ["true"]))  # may be refused: disk full
            time.sleep(2)
            code, body = _health(client, server.url)
            assert code == 200 and body["loop"]["running"], body  # alive, cycling
            assert body["launches"]["disk"]["free_mib"] < 8, body
            assert _job(server.url, waiting)["state"] == "pending"
            (state / "ballast-2").unlink()
            (state / "ballast-1").unlink()
            _all_succeed(server.url, [waiting, *accepted], 30)
            code, body = _health(client, server.url)
            assert code == 200 and body["launches"]["waiting"] is None, body
            events = HTTP.get(f"{server.url}/v1/events", timeout=10).json()["events"]
            kinds = {e["kind"] for e in events}
            assert {"launches-waiting", "launches-resumed"} <= kinds, kinds
        finally:
            server.stop()


def test_a_read_only_jobs_directory_holds_launches(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = Server(state, *FAKE).start()
    client = httpx.Client()
    try:
        with tmpfs(state / "jobs", 1, "ro"):
            job = _submit(server.url, ["true"])
            wait_for(
                lambda: _job(server.url, job)["reason"].startswith("ReadOnly"),
                10,
                "the job's reason to say ReadOnly",
            )
            code, body = _health(client, server.url)
            assert code == 200 and body["launches"]["waiting"].startswith("ReadOnly"), body
            assert _job(server.url, job)["state"] == "pending"
        _all_succeed(server.url, [job], 20)
        assert _health(client, server.url)[0] == 200
    finally:
        server.stop()


def _lowest_free_fd(pid: int) -> int:
    used = {int(n) for n in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


def test_an_exhausted_descriptor_limit_leaves_the_loop_alive(tmp_path: Path) -> None:
    server = Server(tmp_path / "state", *FAKE).start()
    assert server.proc is not None
    pid = server.proc.pid
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    client = httpx.Client()  # one kept-alive connection: it needs no new descriptor
    try:
        running = _submit(server.url, ["sleep", "2"])
        wait_for(lambda: _job(server.url, running)["state"] == "running", 15, "the first job")
        queued = _submit(server.url, ["true"])  # waits for the only GPU
        assert _health(client, server.url)[0] == 200
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_lowest_free_fd(pid), limits[1]))
        # The first job ends; the loop cannot open what it needs (EMFILE) and goes on.
        wait_for(lambda: "Too many open files" in server.log.read_text(), 20, "EMFILE in the log")
        code, body = _health(client, server.url)
        assert code == 200 and body["loop"]["running"], body
        # Where it hits first depends on the executor: reading the first job's cgroup as it
        # is reaped, or opening the second job's logs as it is launched.
        error = body["loop"]["last_error"]
        assert error["stage"] in ("reap", "launch") and "Too many open files" in error["message"]
        wait_for(
            lambda: _health(client, server.url)[1]["loop"]["cycles"] > body["loop"]["cycles"] + 3,
            10,
            "the loop to keep cycling without descriptors",
        )
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        _all_succeed(server.url, [running, queued], 30)
        assert _health(client, server.url)[0] == 200
    finally:
        with contextlib.suppress(OSError):
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        client.close()
        server.stop()


FILLER = r"""
import errno, os, sys, time
ckpt = os.environ["GPUPOOL_CHECKPOINT_DIR"]
marks, attempt = sys.argv[1], os.environ["GPUPOOL_ATTEMPT"]
fill = os.path.join(ckpt, "fill")
with open(fill, "ab") as f:
    try:
        while True:
            f.write(b"\0" * 262144)
            f.flush()
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
time.sleep(1.0)  # the disk stays full for a while, under the scheduler's feet
os.remove(fill)
with open(os.path.join(marks, f"filled-{attempt}"), "w") as f:
    f.write("done")
time.sleep(600)
"""


@pytest.mark.slow
def test_a_disk_filling_job_lost_on_every_restart_stops_at_its_limit(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "filler.py"
    script.write_text(FILLER)
    port = free_port()
    args = (*FAKE, "--lost-retries", "2", "--disk-floor-mib", "4", "--disk-floor-pct", "100")
    with tmpfs(tmp_path / "state", 24) as state:
        job = 0
        for attempt in (1, 2, 3):
            server = Server(state, *args, port=port)
            server.log = tmp_path / "server.log"
            server.start()
            try:
                if attempt == 1:
                    job = _submit(server.url, [sys.executable, str(script), str(marks)])
                wait_for(
                    lambda a=attempt: (marks / f"filled-{a}").exists(),  # type: ignore[misc]
                    30,
                    f"attempt {attempt} to fill the disk",
                )
                handle = state / "jobs" / str(job) / f"handle-{attempt}.json"
                wait_for(handle.exists, 10, "its handle")
                pgid = json.loads(handle.read_text())["pgid"]
                assert _health(httpx.Client(), server.url)[0] == 200
            finally:
                server.kill()  # the scheduler dies ...
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)  # ... and the job with it, leaving no record
        server = Server(state, *args, port=port)
        server.log = tmp_path / "server.log"
        server.start()
        try:
            wait_for(lambda: _job(server.url, job)["state"] == "failed", 20, "the job to fail")
            row = _job(server.url, job)
            assert row["attempts"] == 3, row
            assert "lost 3 times, more than the limit of 2" in row["reason"], row
            assert not (marks / "filled-4").exists()
            code, body = _health(httpx.Client(), server.url)
            assert code == 200, body
            assert "the scheduler loop died" not in server.log.read_text()
        finally:
            server.stop()
