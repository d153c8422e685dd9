"""Shared GPUs through the real `gpupool serve`: jobs that ask for part of one card."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service_proc import HTTP, Server, cli, wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
ENV_DUMP = [
    sys.executable,
    "-c",
    "import json, os, time; json.dump({k: v for k, v in os.environ.items() "
    "if k.startswith(('GPUPOOL_GPU', 'CUDA_MPS'))}, "
    "open(os.path.join(os.environ['HOME'], 'share-env.json'), 'w')); "
    "time.sleep(120)",
]


@pytest.fixture
def one_a100(tmp_path: Path) -> Iterator[Server]:
    """One fake A100-80GB, no config file (so no share_cap)."""
    srv = Server(
        tmp_path / "state",
        "--auth",
        "none",
        "--fake-gpus",
        "1xA100-80GB",
        "--cycle",
        "0.3",
        "--sample",
        "0.2",
    ).start()
    yield srv
    if srv.proc is not None and srv.proc.poll() is None:
        for job in jobs(srv):
            if job["state"] in ("pending", "running", "suspended"):
                HTTP.post(f"{srv.url}/v1/jobs/{job['id']}/cancel", timeout=10)
        wait_for(
            lambda: all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs(srv)),
            30,
            "the jobs to end",
        )
    srv.stop()


def jobs(srv: Server) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = HTTP.get(f"{srv.url}/v1/jobs", timeout=10).json()["jobs"]
    return out


def job(srv: Server, job_id: int) -> dict[str, Any]:
    out: dict[str, Any] = HTTP.get(f"{srv.url}/v1/jobs/{job_id}", timeout=10).json()
    return out


def submit(srv: Server, *args: str, command: list[str] = SLEEP) -> int:
    out = cli(srv.url, "submit", "--json", "--team", "ml", *args, "--", *command)
    assert out.returncode == 0, out.stderr
    job_id: int = json.loads(out.stdout)["id"]
    return job_id


def test_four_online_jobs_of_18gib_share_one_a100_and_a_fifth_and_training_wait(
    one_a100: Server, tmp_path: Path
) -> None:
    srv = one_a100
    online = [
        submit(srv, "--kind", "online-inference", "--gpu-mem", "18GiB", "--name", f"chat-{i}")
        for i in range(4)
    ]
    wait_for(
        lambda: all(job(srv, j)["state"] == "running" for j in online), 30, "four sharers running"
    )
    for j in online:
        placed = job(srv, j)
        assert placed["gpus"] == [{"node": placed["gpus"][0]["node"], "index": 0}]
        assert placed["gpu_mem_mib"] == 18 * 1024
    fifth = submit(srv, "--kind", "online-inference", "--gpu-mem", "18GiB", "--name", "chat-4")
    training = submit(srv, "--kind", "training", "--gpus", "0.25", "--name", "train")
    time.sleep(2.0)  # several cycles (0.3 s each): neither may start
    assert all(job(srv, j)["state"] == "running" for j in online)
    assert job(srv, fifth)["state"] == "pending"
    assert job(srv, training)["state"] == "pending"
    wait_for(lambda: job(srv, fifth)["reason_code"] == "Resources", 30, "reason Resources")
    assert "needs 0.229 of" in job(srv, fifth)["reason"]
    # the training job is behind the fifth sharer (or told of the full card itself)
    assert job(srv, training)["reason_code"] in ("Priority", "Resources")
    shown = cli(srv.url, "ls")
    assert shown.returncode == 0, shown.stderr
    assert "18GiB of" in shown.stdout


def test_a_share_is_told_to_the_job_and_a_share_larger_than_any_card_is_refused(
    one_a100: Server,
) -> None:
    srv = one_a100
    told = submit(srv, "--kind", "online-inference", "--gpus", "0.25", command=ENV_DUMP)
    wait_for(lambda: job(srv, told)["state"] == "running", 30, "the sharer to run")
    env_file = srv.state_dir / "jobs" / str(told)
    wait_for(lambda: any(env_file.rglob("share-env.json")), 30, "the job's environment dump")
    env = json.loads(next(env_file.rglob("share-env.json")).read_text())
    # A fake fleet has no MPS: the share is told, advisory.
    assert env["GPUPOOL_GPU_SHARE"] == "0.250"
    assert env["GPUPOOL_GPU_SHARE_ENFORCED"] == "advisory"
    assert int(env["GPUPOOL_GPU_MEM_MIB"]) == -(-round(78.80 * 1024) * 250 // 1000)
    assert not any(k.startswith("CUDA_MPS") for k in env)
    refused = cli(srv.url, "submit", "--team", "ml", "--gpu-mem", "100GiB", "--", *SLEEP)
    assert refused.returncode != 0
    assert "A100-80GB" in refused.stderr and "78.8GiB" in refused.stderr
