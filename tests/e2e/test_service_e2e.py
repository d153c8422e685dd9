"""End to end through the CLI against a real `gpupool serve` process.

A training script that checkpoints is submitted; an online job preempts it (its team is
guaranteed the GPU); the training job checkpoints on SIGTERM, waits, resumes from its
checkpoint and finishes with the correct result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpupool.examples.ckpt_counter import expected_result
from service_proc import HTTP, Server, cli, configured_server, paced_counter, wait_for

CONFIG = """\
teams:
  - {name: serving, guaranteed: {A100-80GB: 1}}
  - {name: research}
preemption: {min_runtime_s: 0, max_per_job: 3}
"""


@pytest.fixture()
def server(tmp_path: Path) -> Server:
    srv = configured_server(tmp_path, CONFIG, extra=("--sample", "0.5")).start()
    yield srv  # type: ignore[misc]
    srv.stop()


def _show(url: str, job_id: int) -> dict[str, object]:
    out = cli(url, "show", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    job: dict[str, object] = json.loads(out.stdout)
    return job


def test_preempted_training_resumes_from_its_checkpoint(server: Server) -> None:
    url = server.url
    steps = 150
    out = cli(
        url,
        "submit",
        "--gpus",
        "1",
        "--kind",
        "training",
        "--team",
        "research",
        "--priority",
        "low",
        "--checkpoint-every",
        "1s",
        "--grace",
        "20s",
        "--json",
        "--",
        # 60 s on its first attempt, however slow the host is to submit the online job
        *paced_counter(steps, 0.4, 0.02),
    )
    assert out.returncode == 0, out.stderr
    train = json.loads(out.stdout)["id"]
    wait_for(lambda: _show(url, train)["state"] == "running", 20, "the training job to run")
    # let it make progress, then an online job of the guaranteed team claims the GPU
    wait_for(lambda: "step=10" in cli(url, "logs", str(train)).stdout, 60, "training progress")
    out = cli(
        url,
        "submit",
        "--gpus",
        "1",
        "--kind",
        "online-inference",
        "--team",
        "serving",
        "--priority",
        "high",
        "--json",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(1.5); print('served')",
    )
    assert out.returncode == 0, out.stderr
    online = json.loads(out.stdout)["id"]
    # counted, not caught in the act: it is suspended only while the online job runs
    wait_for(lambda: _show(url, train)["preemptions"] == 1, 30, "the preemption")
    wait_for(lambda: _show(url, online)["state"] == "succeeded", 30, "the online job")
    wait_for(lambda: _show(url, train)["state"] == "succeeded", 60, "the resumed training")
    job = _show(url, train)
    assert job["preemptions"] == 1 and job["attempts"] == 2, job
    assert job["gpus"] == [{"node": job["gpus"][0]["node"], "index": 0}]  # type: ignore[index]
    log = cli(url, "logs", str(train)).stdout
    last = [line for line in log.splitlines() if line.startswith("result=")][-1]
    fields = dict(part.split("=") for part in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) > 0  # it resumed from its checkpoint, not from 0
    assert "SIGTERM: checkpoint saved" in log
    # the event stream and the metrics saw it all
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    kinds = [e["kind"] for e in events if e["job_id"] == train]
    assert kinds.count("running") == 2 and "preempting" in kinds and "succeeded" in kinds
    metrics = HTTP.get(f"{url}/metrics").text
    assert 'gpupool_jobs{kind="training",state="succeeded",team="research"} 1.0' in metrics
    assert "DCGM_FI_DEV_GPU_UTIL" in metrics


def test_cli_errors_and_listing(server: Server) -> None:
    url = server.url
    out = cli(url, "submit", "--gpus", "-1", "--team", "x", "--", "true")
    assert out.returncode == 2 and "gpus" in out.stderr
    out = cli(url, "show", "999")
    assert out.returncode == 2 and "999" in out.stderr
    out = cli(url, "submit", "--team", "research", "--json", "--", "true")
    job_id = json.loads(out.stdout)["id"]
    wait_for(lambda: _show(url, job_id)["state"] == "succeeded", 20, "a trivial job")
    listing = cli(url, "ls").stdout
    assert str(job_id) in listing and "succeeded" in listing
    top = cli(url, "top", "--once")
    assert top.returncode == 0 and "A100-80GB" in top.stdout


def test_on_a_fake_fleet_jobs_run_for_real_without_a_gpu(server: Server) -> None:
    url = server.url
    probe = (
        "import os; print('visible=%r fake=%s job=%s ckpt=%s' % ("
        "os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['GPUPOOL_FAKE_GPUS'], "
        "os.environ['GPUPOOL_JOB_ID'], os.path.isdir(os.environ['GPUPOOL_CHECKPOINT_DIR'])))"
    )
    out = cli(url, "submit", "--team", "research", "--json", "--", sys.executable, "-c", probe)
    job_id = json.loads(out.stdout)["id"]
    wait_for(lambda: _show(url, job_id)["state"] == "succeeded", 20, "the probe job")
    log = cli(url, "logs", str(job_id)).stdout
    assert f"visible='' fake=0 job={job_id} ckpt=True" in log, log
