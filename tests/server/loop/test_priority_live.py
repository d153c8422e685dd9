"""Priority preemption through a real `gpupool serve` process with no config file.

Two low-priority checkpointing training jobs fill both GPUs of a fake 2xA100-80GB fleet;
a high-priority online job submitted after them starts within one cycle plus the time
its victim takes to write its checkpoint (the live defaults: a 1 s cycle, a 60 s minimum
runtime that online inference does not wait for); the preempted job resumes from its
checkpoint later and ends with the right result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.examples.ckpt_counter import expected_result
from service_proc import HTTP, Server, cli, wait_for

STEPS = 400
"""40 s of work at 0.1 s a step: the second job still runs when the online one arrives on a
loaded host."""
CYCLE_S = 1.0  # LIVE_DEFAULTS.cycle_s: the server runs without --cycle and without --config
SLACK_S = 10.0
"""What a loaded test host adds to a start (process spawn, the next loop turn)."""


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(
        tmp_path / "state", "--fake-gpus", "2xA100-80GB", "--auth", "none", "--sample", "0.5"
    ).start(timeout_s=60.0)
    yield srv
    for job in HTTP.get(f"{srv.url}/v1/jobs", timeout=10).json()["jobs"]:
        if job["state"] in ("pending", "running", "preempting", "suspended"):
            HTTP.post(f"{srv.url}/v1/jobs/{job['id']}/cancel", timeout=10)
    srv.stop()


def show(url: str, job_id: int) -> dict[str, Any]:
    job: dict[str, Any] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return job


def submit(url: str, *args: str) -> int:
    out = cli(url, "submit", "--json", *args)
    assert out.returncode == 0, out.stderr
    job_id: int = json.loads(out.stdout)["id"]
    return job_id


def logs(url: str, job_id: int) -> str:
    return HTTP.get(f"{url}/v1/jobs/{job_id}/logs", timeout=10).text


def events(url: str) -> list[dict[str, Any]]:
    body = HTTP.get(f"{url}/v1/events", params={"after": 0, "wait": 0}, timeout=10).json()
    return list(body["events"])


def first(evs: list[dict[str, Any]], job_id: int, kind: str) -> float:
    return min(float(e["at_s"]) for e in evs if e["job_id"] == job_id and e["kind"] == kind)


@pytest.mark.slow  # real jobs: a minute or so
def test_online_inference_preempts_low_priority_training_and_the_victim_resumes(
    server: Server,
) -> None:
    url = server.url
    counter = [sys.executable, "-m", "gpupool.examples.ckpt_counter"]
    train = [
        submit(
            url,
            *("--team", "a", "--kind", "training", "--priority", "low", "--gpus", "1"),
            *("--checkpoint-every", "5s", "--grace", "20s", "--"),
            *counter,
            *("--steps", str(STEPS), "--step-s", "0.1", "--every", "5"),
        )
        for _ in range(2)
    ]
    wait_for(lambda: all(show(url, j)["state"] == "running" for j in train), 60, "both to run")
    wait_for(lambda: all("step=10" in logs(url, j) for j in train), 30, "training progress")
    online = submit(
        url,
        *("--team", "a", "--kind", "online-inference", "--priority", "high", "--gpus", "1"),
        *("--", sys.executable, "-c", "import time; time.sleep(2); print('served')"),
    )
    wait_for(lambda: show(url, online)["state"] in ("running", "succeeded"), 40, "online to run")
    evs = events(url)
    victims = [j for j in train if any(e["job_id"] == j and e["kind"] == "preempting" for e in evs)]
    assert len(victims) == 1, evs  # one GPU is enough: one victim
    victim = victims[0]
    submitted = first(evs, online, "submitted")
    started = first(evs, online, "running")
    stopped = first(evs, victim, "preempting")
    vacated = first(evs, victim, "suspended")
    # within one cycle of its arrival the victim was told to stop; the online job started
    # as soon as the victim had written its checkpoint and left
    assert stopped - submitted <= CYCLE_S + SLACK_S, (submitted, stopped)
    assert started - submitted <= CYCLE_S + (vacated - stopped) + SLACK_S, evs
    assert started >= vacated - 1e-3
    # the other training job ran on untouched; the victim resumes from its checkpoint
    wait_for(lambda: show(url, online)["state"] == "succeeded", 30, "the online job to end")
    for j in train:
        wait_for(lambda j=j: show(url, j)["state"] == "succeeded", 150, f"training {j} to end")
    job = show(url, victim)
    assert job["preemptions"] == 1 and job["attempts"] == 2, job
    log = cli(url, "logs", str(victim)).stdout
    assert "SIGTERM: checkpoint saved" in log
    last = [line for line in log.splitlines() if line.startswith("result=")][-1]
    fields = dict(part.split("=") for part in last.split())
    assert int(fields["result"]) == expected_result(STEPS)
    assert int(fields["resumed_from"]) > 0  # from its checkpoint, not from step 0
    other = next(j for j in train if j != victim)
    assert show(url, other)["preemptions"] == 0
