"""Start and stop a real `gpupool serve` process for end-to-end tests (loopback only)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


FIRST_WORKER_PORT, PORTS_PER_WORKER = 20_000, 1_000
"""Under xdist, worker gwN hands out the ports [20000 + 1000 N, 20000 + 1000 (N + 1)): below
the kernel's ephemeral ports (32768 up), so a port it hands out is never the one that
another worker, or any socket the kernel numbers itself, is handed meanwhile."""
_cursor: list[int] = []


HTTP = httpx.Client(timeout=5.0, verify=False, limits=httpx.Limits(max_keepalive_connections=0))
"""Plain-http requests to the servers under test, through one client built once: each
`httpx.get` builds a TLS context first (40 ms of CPU, for nothing on http). No connection is
kept: servers die and come back on the same port."""


def free_port() -> int:
    """A loopback port free now, for a server the test starts next. Alone the kernel picks
    it; under xdist (PYTEST_XDIST_WORKER=gwN) it comes from the worker's own range, starting
    at a random place in it (another test run on the machine uses the same ranges)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    base = FIRST_WORKER_PORT + n * PORTS_PER_WORKER
    if n < 0 or base + PORTS_PER_WORKER > 32768:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            return port
    if not _cursor:
        _cursor.append(random.randrange(PORTS_PER_WORKER))
    for _ in range(PORTS_PER_WORKER):  # bounded: one pass over the range
        port = base + _cursor[0] % PORTS_PER_WORKER
        _cursor[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (by another test run, or still closing)
            return port
    raise RuntimeError(f"no free port in {base}..{base + PORTS_PER_WORKER - 1}")


_STARTED: list[Server] = []
"""Every server a test made, until its leftover jobs are reaped (`reap_left_jobs`)."""


def reap_left_jobs() -> None:
    """SIGKILL the jobs that stopped servers left running. A local server leaves its jobs
    running when it stops, on purpose (a restart adopts them); at the end of a test
    nobody will, and a job left behind would eat the CPU of every test after it. Only a
    process that still is the recorded one (pid and start ticks) is killed."""
    from gpupool.server.agent.processes import read_start_ticks

    for server in list(_STARTED):
        if server.proc is not None and server.proc.poll() is None:
            continue  # still serving (a module's server): reaped once it has stopped
        _STARTED.remove(server)
        for path in server.state_dir.glob("jobs/*/handle-*.json"):
            try:
                handle = json.loads(path.read_text(encoding="utf-8"))
                pid, pgid, ticks = int(handle["pid"]), int(handle["pgid"]), handle["start_ticks"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if read_start_ticks(pid) == ticks:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)


def configured_server(
    folder: Path, config_text: str, gpus: str = "1xA100-80GB", extra: tuple[str, ...] = ()
) -> Server:
    """`gpupool serve` (not started yet) on fake GPUs, without authentication, a 0.2 s cycle
    and `config_text` as its --config file (written to folder/service.yaml); its state in
    folder/state. `extra`: more arguments of `gpupool serve`."""
    config = folder / "service.yaml"
    config.write_text(config_text, encoding="utf-8")
    return Server(
        folder / "state",
        *("--fake-gpus", gpus, "--auth", "none", "--config", str(config), "--cycle", "0.2"),
        *extra,
    )


class Server:
    """`gpupool serve` in its own process, on 127.0.0.1, with its output in a file.

    Jobs run as the server's user (--no-isolation) unless `isolation`: a test's jobs are
    often the test's own interpreter, which a team's user may not be able to run."""

    def __init__(
        self,
        state_dir: Path,
        *args: str,
        port: int | None = None,
        isolation: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args if isolation else ("--no-isolation", *args)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir / "server.log"
        _STARTED.append(self)

    def start(self, timeout_s: float = 60.0) -> Server:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()}")
            try:
                if HTTP.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up: {self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def cli(url: str, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": url}
    env.pop("GPUPOOL_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    """Poll `predicate` until it holds, for at most `timeout_s`. Between polls it waits 0.2 s,
    or twice what the last poll took (a `gpupool` command is a process of a third of a CPU
    second): polling keeps to a third of a core, so the suite's parallel tests get the rest."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        began = time.monotonic()
        if predicate():  # type: ignore[operator]
            return
        time.sleep(min(max(0.2, 2 * (time.monotonic() - began)), 1.0))
    raise AssertionError(f"timed out waiting for {what}")


def counter(steps: int, step_s: float) -> list[str]:
    """The checkpointing example job: a sum over `steps`, a checkpoint every 5 steps."""
    return [sys.executable, "-m", "gpupool.examples.ckpt_counter", "--steps", str(steps),
            "--step-s", str(step_s), "--every", "5"]  # fmt: skip


def paced_counter(steps: int, first_s: float, resumed_s: float = 0.01) -> list[str]:
    """The counter, slow on its first attempt (so a loaded host cannot see it finish before
    the test stops it) and fast once resumed; the sum does not depend on the pace."""
    paced = " ".join(counter(steps, first_s)).replace(f"--step-s {first_s}", '--step-s "$pace"')
    pick = f'if [ -n "$GPUPOOL_RESUME" ]; then pace={resumed_s}; else pace={first_s}; fi'
    return ["sh", "-c", f"{pick}; exec {paced}"]
