"""Why a job waits, through a real `gpupool serve` on a fake fleet with no config file:
a job needing more GPUs than are free waits with Resources and the numbers, one behind
a higher-priority job with Priority; `gpupool why` and `gpupool ls` say so."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service_proc import HTTP, Server, cli, wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(
        tmp_path / "state", "--fake-gpus", "2xA100-80GB", "--auth", "none", "--cycle", "0.2"
    ).start()
    yield srv
    srv.stop()


def _submit(url: str, gpus: int, priority: str) -> int:
    body = {"command": SLEEP, "team": "ml", "gpus": gpus, "priority": priority}
    r = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _job(url: str, job_id: int) -> dict[str, object]:
    r = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10.0)
    assert r.status_code == 200, r.text
    job: dict[str, object] = r.json()
    return job


def test_gpupool_why_gives_resources_with_the_numbers_and_priority(server: Server) -> None:
    url = server.url
    running = _submit(url, 1, "normal")
    wait_for(lambda: _job(url, running)["state"] == "running", 30, "the first job to run")
    big = _submit(url, 2, "high")
    behind = _submit(url, 2, "low")
    wait_for(
        lambda: _job(url, behind).get("reason_code") == "Priority", 30, "a reason for the last job"
    )
    assert _job(url, big)["reason_code"] == "Resources"
    out = cli(url, "why", str(big))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"job {big} pending: Resources\n"
        "  needs 2 A100-80GB GPUs on one node, largest free block 1 (1 free in the pool)\n"
    )
    out = cli(url, "why", str(behind))
    assert out.returncode == 0 and out.stdout.startswith(f"job {behind} pending: Priority\n")
    assert "behind 1 waiting job for the A100-80GB pool" in out.stdout
    assert f"(first: {big})" in out.stdout
    listing = cli(url, "ls").stdout
    assert "Resources" in listing and "Priority" in listing
    out = cli(url, "why", "999")
    assert out.returncode != 0 and "999" in out.stderr
