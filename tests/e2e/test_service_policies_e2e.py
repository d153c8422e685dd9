"""What the one core decides, carried out by a real `gpupool serve` process on a fake fleet:
a quota window, the online reserve, price deferral, a hot GPU avoided, and a configuration
refused at start (a power cap and its reset, on both executors: tests/e2e/test_pool_e2e.py).
The scheduler's clock is started at a chosen moment (--clock-start) so a night window or a
cheap hour is now."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service_proc import HTTP, ROOT, Server, cli, wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]
QUICK = [sys.executable, "-c", "import time; time.sleep(6)"]


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(config: str, *args: str) -> Server:
        path = tmp_path / f"config-{len(started)}.yaml"
        path.write_text(config, encoding="utf-8")
        srv = Server(
            tmp_path / f"state-{len(started)}",
            "--auth",
            "none",
            "--config",
            str(path),
            "--cycle",
            "0.5",
            "--sample",
            "0.2",
            *args,
        ).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:  # the jobs' processes outlive the server: cancel them first
        if srv.proc is not None and srv.proc.poll() is None:
            for job in HTTP.get(f"{srv.url}/v1/jobs", timeout=10).json()["jobs"]:
                if job["state"] in ("pending", "running", "preempting", "suspended"):
                    HTTP.post(f"{srv.url}/v1/jobs/{job['id']}/cancel", timeout=10)
            wait_for(
                lambda srv=srv: all(
                    j["state"] in ("succeeded", "failed", "cancelled")
                    for j in HTTP.get(f"{srv.url}/v1/jobs", timeout=10).json()["jobs"]
                ),
                30,
                "the jobs to end",
            )
        srv.stop()


def submit(url: str, *args: str, command: list[str] = SLEEP) -> int:
    out = cli(url, "submit", "--json", *args, "--", *command)
    assert out.returncode == 0, out.stderr
    job_id: int = json.loads(out.stdout)["id"]
    return job_id


def show(url: str, job_id: int) -> dict[str, Any]:
    """What `gpupool show --json` prints (read over HTTP: polled many times)."""
    job: dict[str, Any] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return job


def state(url: str, job_id: int) -> str:
    return str(show(url, job_id)["state"])


def events(url: str) -> list[dict[str, Any]]:
    body = HTTP.get(f"{url}/v1/events", params={"after": 0, "wait": 0}, timeout=10).json()
    return list(body["events"])


WINDOWED = """\
teams:
  - {name: day, guaranteed: {A100-80GB: 4}}
  - {name: night}
windows:
  - {from: "00:00", to: "06:00", teams: {day: {guaranteed: 0, max: 0},
                                          night: {guaranteed: 1.0, max: 1.0}}}
"""


@pytest.mark.parametrize(
    ("moment", "gets", "waits"),
    [("2026-12-01T03:00:00", "night", "day"), ("2026-12-01T12:00:00", "day", "night")],
)
def test_a_night_window_decides_which_team_gets_the_gpus(
    serve: Any, moment: str, gets: str, waits: str
) -> None:
    srv = serve(WINDOWED, "--fake-gpus", "4xA100-80GB", "--clock-start", moment)
    jobs = {t: submit(srv.url, "--team", t, "--gpus", "4") for t in ("day", "night")}
    wait_for(lambda: state(srv.url, jobs[gets]) == "running", 20, f"{gets} to run")
    assert state(srv.url, jobs[waits]) == "pending", moment


RESERVED = """\
teams: [{name: ml}]
online_reserve: 0.25
"""


def test_the_reserve_holds_a_gpu_that_only_online_inference_takes(serve: Any) -> None:
    """Training that checkpoints 40 GiB per GPU cannot leave within a cycle, so it may not
    borrow the reserve (1 of 4 GPUs): three run, one waits; an online job takes the fourth."""
    srv = serve(RESERVED, "--fake-gpus", "4xA100-80GB")
    train = [
        submit(srv.url, "--team", "ml", "--kind", "training", "--checkpoint-gib", "40")
        for _ in range(4)
    ]
    wait_for(lambda: [state(srv.url, j) for j in train].count("running") == 3, 20, "three to run")
    assert [state(srv.url, j) for j in train].count("pending") == 1
    online = submit(srv.url, "--team", "ml", "--kind", "online-inference", "--priority", "high")
    wait_for(lambda: state(srv.url, online) == "running", 20, "the online job to start")
    assert [state(srv.url, j) for j in train].count("running") == 3  # nothing was preempted


PRICED = """\
teams: [{name: ml}]
energy: {tariff: guangdong-tou, price_aware: true, deferral_slot_min: 1}
"""


def test_a_deadline_job_is_deferred_to_the_cheap_hour_and_starts_before_its_deadline(
    serve: Any,
) -> None:
    """At 23:45 (flat price) a 10-minute job due at 04:00 waits for the valley from 00:00
    (guangdong-tou's hours read as UTC here); the clock runs 60x, so 00:00 comes in 15 s
    (room for a loaded machine's slow submit).
    The day lies years ahead (a Tuesday, like the first one chosen) because the CLI refuses
    a --deadline that has passed by its own clock."""
    start = "2037-12-01T23:45:00"
    srv = serve(PRICED, "--fake-gpus", "1xA100-80GB", "--clock-start", start, "--clock-speed", "60")
    deadline = at("2037-12-02T04:00:00")
    job = submit(srv.url, "--team", "ml", "--duration", "10m", "--deadline", f"{deadline:.0f}")
    seen: list[dict[str, Any]] = []

    def deferred() -> bool:
        seen.append(show(srv.url, job))
        return seen[-1]["state"] == "pending" and "deferred until 00:00" in seen[-1]["reason"]

    wait_for(deferred, 20, "the deferral")
    assert str(seen[-1]["reason"]).endswith("(price)"), seen[-1]
    assert any(e["kind"] == "deferred" for e in events(srv.url))
    wait_for(lambda: state(srv.url, job) == "running", 30, "the start in the cheap hour")
    started = float(show(srv.url, job)["started_at"])
    assert at("2037-12-02T00:00:00") <= started <= deadline - 600


HOT = """\
teams: [{name: ml}]
energy: {thermal: {aware: true}}
"""


def test_a_gpu_reported_hot_is_avoided(serve: Any) -> None:
    srv = serve(HOT, "--fake-gpus", "4xA100-80GB", "--fake-inlet", "0=45,1=45")
    jobs = [submit(srv.url, "--team", "ml") for _ in range(2)]
    wait_for(lambda: all(state(srv.url, j) == "running" for j in jobs), 20, "both to run")
    gpus = sorted(g["index"] for j in jobs for g in show(srv.url, j)["gpus"])
    assert gpus == [2, 3]


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ("teams: [{name: ml}]\npolcy: fifo\n", "polcy"),
        ("teams: [{name: ml, guaranteed: {A100-40GB: 2}}]\n", "A100-40GB"),
        ("teams: [{name: ml, guaranteed: {A100-80GB: 1.5}}]\n", "whole number"),
    ],
)
def test_a_bad_configuration_is_refused_at_start(tmp_path: Path, config: str, named: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(config, encoding="utf-8")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--state-dir",
            str(tmp_path / "state"),
            "--auth",
            "none",
            "--fake-gpus",
            "2xA100-80GB",
            "--config",
            str(path),
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 2, out
    assert named in out.stderr and str(path) in out.stderr, out.stderr
