"""A GPU fault in a real `gpupool serve` (fake 2xA100-80GB fleet, the local executor).

Job A, the checkpointing counter (slow on its first attempt), runs on one GPU and job B on
the other. An admin injects XID 79 into A's GPU (POST /v1/admin/fake-faults): the card is
drained alone, A leaves with a checkpoint and waits (no healthy GPU is free), B runs on
untouched. B ends when the test lets it (a flag file), A resumes on B's GPU from its
checkpoint and ends with the exact sum; after a repair the card comes back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.examples.ckpt_counter import expected_result
from service_proc import HTTP, Server, cli, paced_counter, wait_for

STEPS = 100
"""20 s at 0.2 s a step on the first attempt: still running when the fault comes; once
resumed, 0.01 s a step."""
FAKE = ("--fake-gpus", "2xA100-80GB", "--auth", "none", "--cycle", "0.2", "--sample", "0.2")


def submit(url: str, name: str, command: list[str], **extra: Any) -> int:
    body = {"command": command, "team": "t", "name": name, "kind": "training", **extra}
    r = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def job(url: str, job_id: int) -> dict[str, Any]:
    r = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def logs(url: str, job_id: int) -> str:
    return HTTP.get(f"{url}/v1/jobs/{job_id}/logs", timeout=10).text


def events(url: str, kind: str) -> list[dict[str, Any]]:
    body = HTTP.get(f"{url}/v1/events", params={"after": 0, "wait": 0}, timeout=10).json()
    return [e for e in body["events"] if e["kind"] == kind]


def fault(url: str, **body: Any) -> dict[str, Any]:
    r = HTTP.post(f"{url}/v1/admin/fake-faults", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def gpus_out(url: str) -> list[dict[str, Any]]:
    out = cli(url, "nodes", "--json")
    assert out.returncode == 0, out.stderr
    return [o for node in json.loads(out.stdout)["nodes"] for o in node["gpus_out"]]


@pytest.mark.slow  # a real server and real jobs: about 10 s
def test_an_xid_drains_one_card_and_the_job_resumes_on_the_other_once_free(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "state", *FAKE).start()
    flag = tmp_path / "b-may-end"
    # B waits for the flag (30 s at most, then fails): it ends when the test says
    waits = f'i=0; while [ ! -e "{flag}" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done'
    try:
        url = server.url
        a = submit(
            url,
            "a",
            paced_counter(STEPS, 0.2),
            checkpoint_every_s=1.0,
            grace_s=10.0,
        )
        b = submit(url, "b", ["sh", "-c", f'{waits}; [ -e "{flag}" ]'], grace_s=1.0)
        wait_for(
            lambda: job(url, a)["state"] == "running" and job(url, b)["state"] == "running",
            20,
            "A and B to run",
        )
        gpu_a = job(url, a)["gpus"][0]["index"]
        gpu_b = job(url, b)["gpus"][0]["index"]
        assert {gpu_a, gpu_b} == {0, 1}
        wait_for(lambda: "(checkpointed)" in logs(url, a), 20, "A's first checkpoint")

        assert fault(url, gpu=gpu_a, fault="xid", xid=79)["done"] == "XID 79"
        wait_for(lambda: job(url, a)["state"] in ("pending", "suspended"), 20, "A to leave")
        assert "SIGTERM: checkpoint saved" in logs(url, a)
        unhealthy = events(url, "gpu-unhealthy")
        assert len(unhealthy) == 1, unhealthy
        assert f"GPU {gpu_a} of node " in unhealthy[0]["message"]
        assert "XID 79" in unhealthy[0]["message"], unhealthy[0]["message"]
        out = gpus_out(url)
        assert [o["gpu"] for o in out] == [gpu_a]
        assert "XID 79" in out[0]["reason"], out
        # no healthy GPU is free: A waits while B runs on, untouched
        row_b = job(url, b)
        assert row_b["state"] == "running" and row_b["attempts"] == 1
        waiting = job(url, a)
        assert waiting["state"] in ("pending", "suspended"), waiting
        assert "XID 79" in waiting["reason"], waiting["reason"]

        flag.touch()  # B ends; A resumes on B's GPU, fast
        wait_for(lambda: job(url, a)["state"] == "succeeded", 30, "A to succeed")
        row_a, row_b = job(url, a), job(url, b)
        assert row_b["state"] == "succeeded" and row_b["attempts"] == 1, row_b
        assert row_a["attempts"] == 2, row_a
        assert [g["index"] for g in row_a["gpus"]] == [gpu_b], row_a["gpus"]
        last = logs(url, a).strip().splitlines()[-1]
        result, steps, resumed = (part.split("=")[1] for part in last.split())
        assert (int(result), int(steps)) == (expected_result(STEPS), STEPS), last
        assert 0 < int(resumed) < STEPS, last
        assert gpus_out(url) == [{"gpu": gpu_a, "reason": out[0]["reason"]}]  # still out

        assert fault(url, gpu=gpu_a, fault="repair")["done"] == "repaired"
        wait_for(lambda: gpus_out(url) == [], 10, "the repaired GPU to come back")
        healthy = events(url, "gpu-healthy")
        assert len(healthy) == 1 and f"GPU {gpu_a} of node " in healthy[0]["message"]
        injected = [e["message"] for e in events(url, "fake-fault")]
        assert len(injected) == 2, injected
        assert injected[0].startswith(f"fake fault on GPU {gpu_a} of node ")
        assert injected[0].endswith("by anonymous: XID 79") and injected[1].endswith(": repaired")
    finally:
        flag.touch()
        server.stop()
