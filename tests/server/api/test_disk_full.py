"""A submission the server's disk has no room for is refused with the reason (507 and a
sentence saying what to do), never a 500, and nothing of it is recorded; once space is freed,
submissions go through again. The disk is real: a small tmpfs (root only) holding the
database, filled by a file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store, database_url, out_of_space
from pools import fill as fill_disk
from service_proc import HTTP, Server, cli

SIZE_MIB = 24
JOB = {"command": ["python", "train.py", "--data", "x" * 2000], "team": "nlp"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of SIZE_MIB MiB, unmounted at the end."""
    if os.geteuid() != 0:
        if os.environ.get("GPUPOOL_REQUIRE_ISOLATION") == "1":
            pytest.fail("mounting a small tmpfs needs root (GPUPOOL_REQUIRE_ISOLATION=1)")
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m", "tmpfs", str(disk)], check=True
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    return fill_disk(disk, SIZE_MIB)


def test_out_of_space_is_told_apart_from_other_database_errors() -> None:
    import errno
    import sqlite3

    import psycopg
    from sqlalchemy.exc import OperationalError

    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY
    assert out_of_space(OperationalError("INSERT", {}, full))
    assert not out_of_space(OperationalError("INSERT", {}, locked))
    assert out_of_space(OperationalError("INSERT", {}, psycopg.errors.DiskFull("no space")))
    assert not out_of_space(OperationalError("INSERT", {}, psycopg.errors.AdminShutdown("x")))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise RuntimeError("write failed") from cause
    except RuntimeError as chained:
        assert out_of_space(chained)
    assert not out_of_space(OSError(errno.EACCES, "Permission denied"))


def test_a_submit_on_a_full_disk_is_refused_with_the_reason_and_nothing_is_recorded(
    small_disk: Path,
) -> None:
    state = small_disk / "state"
    store = Store(database_url(None, state / "db"))
    store.migrate()
    config = LiveConfig(state_dir=state, sample_s=0.0, host="h")
    service = LiveService(
        config, store, FakeExecutor(), FakeTelemetry("2xA100-80GB"), ManualClock(1000.0)
    )
    with TestClient(create_app(service, store, auth=False), raise_server_exceptions=False) as c:
        assert c.post("/v1/jobs", json=JOB).status_code == 201
        filler = fill(small_disk)

        for _ in range(3):  # the fast door, again and again: never a 500
            r = c.post("/v1/jobs", json=JOB)
            assert r.status_code == 507, r.text
            assert "no disk space left" in r.json()["detail"]
            assert "free space on the disk" in r.json()["detail"]
        batch = c.post("/v1/jobs/batch", json={"jobs": [JOB, JOB]})
        assert batch.status_code == 507, batch.text
        listed = c.get("/v1/jobs")
        assert listed.status_code == 200  # reading still works
        assert len(listed.json()["jobs"]) == 1  # nothing of the refused ones was recorded

        filler.unlink()
        r = c.post("/v1/jobs", json=JOB)
        assert r.status_code == 201, r.text
        assert len(c.get("/v1/jobs").json()["jobs"]) == 2
    store.close()


@pytest.mark.slow
def test_gpupool_submit_says_why_the_server_refused(small_disk: Path, tmp_path: Path) -> None:
    server = Server(small_disk / "state", "--fake-gpus", "1xA100-80GB", "--auth", "none")
    server.start()
    try:
        filler = fill(small_disk)
        out = cli(server.url, "submit", "--team", "nlp", "--", sys.executable, "-c", "pass")
        assert out.returncode != 0
        assert "no disk space left" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        assert HTTP.get(f"{server.url}/healthz", timeout=5).status_code in (200, 503)
        filler.unlink()
        again = cli(server.url, "submit", "--team", "nlp", "--", sys.executable, "-c", "pass")
        assert again.returncode == 0, again.stderr
    finally:
        server.stop()
