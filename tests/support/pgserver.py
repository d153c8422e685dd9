"""A throwaway PostgreSQL server for tests: a fresh cluster in a temp dir, gone afterwards.

Tests import the `pg_url` fixture (`from pgserver import pg_url  # noqa: F401`). Without
PostgreSQL binaries the PostgreSQL tests skip, unless GPUPOOL_REQUIRE_PG=1 (CI sets it), in
which case they fail: CI must never pass by skipping the database it ships with.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

STOP_TIMEOUT_S = 10.0
USER = "postgres"


def find_bin_dir() -> Path | None:
    """GPUPOOL_PG_BIN, else pg_config --bindir, else the newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    if os.environ.get("GPUPOOL_PG_BIN"):
        candidates.append(Path(os.environ["GPUPOOL_PG_BIN"]))
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    candidates += [Path(p) for p in versions]
    for bin_dir in candidates:
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file():
            return bin_dir
    return None


def unavailable() -> str | None:
    """Why no server can be started here, or None if one can."""
    if find_bin_dir() is None:
        return (
            "no PostgreSQL binaries (initdb, pg_ctl) found; install postgresql or set "
            "GPUPOOL_PG_BIN to its bin directory"
        )
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(USER)
        except KeyError:
            return "running as root but there is no 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gone(pid: int) -> bool:
    """True once the process has exited (a zombie nobody reaped counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class PgServer:
    """`with PgServer() as pg: pg.url` - a private server on a free loopback port.

    As root the server runs as the postgres user (PostgreSQL refuses root); otherwise as us.
    fsync stays on so commit durability is the real thing.
    """

    def __init__(self, dbname: str = "gpupool") -> None:
        self.dbname = dbname
        self.port = 0
        self.base: Path | None = None
        self.url = ""

    @property
    def data_dir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.base / "server.log" if self.base else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(
                f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()}\n{tail}"
            )

    def __enter__(self) -> PgServer:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError(unavailable() or "no PostgreSQL binaries")
        self.base = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
        try:
            if os.geteuid() == 0:
                shutil.chown(self.base, USER, USER)
            # -N: a throwaway cluster need not fsync its initial files (saves most of a second)
            self._run(
                str(bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-A",
                "trust",
                "-U",
                USER,
                "-N",
                "--no-instructions",
            )
            for attempt in range(3):  # a free port can be taken between probe and bind
                self.port = _free_port()
                options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=on"
                try:
                    self._run(
                        str(bin_dir / "pg_ctl"),
                        "start",
                        "-D",
                        str(self.data_dir),
                        "-w",
                        "-s",
                        "-l",
                        str(self.base / "server.log"),
                        "-o",
                        options,
                    )
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
            admin = f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')
            self.url = f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{self.dbname}"
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server by PID, wait for it, then remove every file.

        SIGQUIT (immediate shutdown) rather than SIGINT: a fast shutdown first checkpoints,
        i.e. fsyncs every database the tests created, which takes seconds for files that are
        deleted right after. SIGKILL only if the postmaster ignores it.
        """
        if self.base is None:
            return
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split("\n", 1)[0])
            for sig in (signal.SIGQUIT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while time.monotonic() < deadline and not _gone(pid):
                    time.sleep(0.02)
                if _gone(pid):
                    break
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def fresh_schema(url: str) -> str:
    """The URL of a new, empty schema in the database `url` names (e.g. one per test).

    Connections made through it see only that schema (search_path), so to the code under test
    it is a brand-new database; creating one takes a millisecond where CREATE DATABASE copies
    and fsyncs a whole template.
    """
    name = f"t_{uuid.uuid4().hex[:16]}"
    parsed = make_url(url)
    conninfo = (
        f"host={parsed.host} port={parsed.port} user={parsed.username} dbname={parsed.database}"
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    isolated = parsed.update_query_dict({"options": f"-csearch_path={name}"})
    return isolated.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """postgresql+psycopg://postgres@127.0.0.1:PORT/gpupool on a server private to the session.

    Skips without PostgreSQL binaries, or fails when GPUPOOL_REQUIRE_PG=1 (as in CI).
    """
    why = unavailable()
    if why is not None:
        if os.environ.get("GPUPOOL_REQUIRE_PG") == "1":
            pytest.fail(f"GPUPOOL_REQUIRE_PG=1 but {why}")
        pytest.skip(why)
    with PgServer() as server:
        yield server.url
