"""Kill the server with SIGKILL at random moments and restart it: nothing accepted is lost.

Each round submits jobs through the API (with idempotency keys), then SIGKILLs the
server at a random point. After the last restart every job the API ever answered for
must exist and finish with the right result: processes that survived the crash are
re-adopted, the others are requeued from their last checkpoint.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

from gpupool.examples.ckpt_counter import expected_result
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import HTTP, Server, free_port, wait_for

STEPS = 25
LONG_KEY, LONG_STEPS = 10**6, 30
"""One job that outlives the last crash and the restart however slow the host: it waits
for a go file that the test writes only once the last server is up (at most 120 s)."""


def _steps(k: int) -> int:
    return LONG_STEPS if k == LONG_KEY else STEPS


def _spec(k: int, go: Path | None = None) -> dict[str, object]:
    if k % 3 == 2:
        return {"command": ["true"], "team": "research", "name": f"quick-{k}"}
    counter = [sys.executable, "-m", "gpupool.examples.ckpt_counter"]
    counter += ["--steps", str(_steps(k)), "--step-s", "0.1", "--every", "5"]
    if k == LONG_KEY:
        assert go is not None
        gate = (
            'echo waiting; echo "for $1"; i=0; '
            'while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; '
            'shift; exec "$@"'
        )
        counter = ["sh", "-c", gate, "sh", str(go), *counter]
    return {
        "command": counter,
        "team": "research",
        "name": f"count-{k}",
        "grace_s": 10,
        "max_retries": 2,
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def db_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """No --db (SQLite in the state dir), or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return ()
    return ("--db", fresh_schema(request.getfixturevalue("pg_url")))


@pytest.mark.slow  # long: started first (tests/conftest.py orders slow modules first)
def test_sigkill_at_random_points_loses_nothing(tmp_path: Path, db_args: tuple[str, ...]) -> None:
    rng = random.Random(20261130)
    state = tmp_path / "state"
    go = tmp_path / "go"
    port = free_port()
    args = ("--fake-gpus", "2xA100-80GB", "--auth", "none", "--cycle", "0.2", "--sample", "0.5")
    args += db_args
    accepted: dict[str, int] = {}
    k = 0
    for _round in range(4):
        server = Server(state, *args, port=port).start()
        try:
            # a retried submit after the restart returns the job it created before
            for key, job_id in list(accepted.items())[:2]:
                r = HTTP.post(
                    f"{server.url}/v1/jobs",
                    json=_spec(int(key), go),
                    headers={"Idempotency-Key": key},
                )
                assert r.status_code == 200 and r.json()["id"] == job_id
            deadline = time.monotonic() + rng.uniform(0.3, 2.5)
            while time.monotonic() < deadline:
                key = str(k)
                r = HTTP.post(
                    f"{server.url}/v1/jobs", json=_spec(k), headers={"Idempotency-Key": key}
                )
                if r.status_code in (200, 201):
                    accepted[key] = r.json()["id"]
                k += 1
                time.sleep(rng.uniform(0.0, 0.3))
            if _round == 3:  # the last crash hits a running job, however slow the host
                key = str(LONG_KEY)
                r = HTTP.post(
                    f"{server.url}/v1/jobs",
                    json=_spec(LONG_KEY, go),
                    headers={"Idempotency-Key": key},
                )
                accepted[key] = r.json()["id"]
                job_url = f"{server.url}/v1/jobs/{accepted[key]}"
                # Its process has started once it prints (running alone is written
                # before the process starts).
                wait_for(
                    lambda u=job_url: len(HTTP.get(f"{u}/logs").text.splitlines()) >= 2,
                    60,
                    "the long job to be running before the last crash",
                )
        finally:
            server.kill()
    server = Server(state, *args, port=port).start()
    go.touch()  # the long job may finish now: the server that adopts it is up
    try:
        url = server.url

        def all_done() -> bool:
            jobs = HTTP.get(f"{url}/v1/jobs", params={"limit": 10_000}).json()["jobs"]
            by_id = {j["id"]: j for j in jobs}
            assert set(accepted.values()) <= set(by_id), "an accepted job was lost"
            return all(by_id[i]["state"] == "succeeded" for i in accepted.values())

        wait_for(all_done, 120, "every accepted job to succeed")
        jobs = HTTP.get(f"{url}/v1/jobs", params={"limit": 10_000}).json()["jobs"]
        assert len(jobs) == len(accepted)  # idempotent: no duplicates either
        for key, job_id in accepted.items():
            if int(key) % 3 == 2:
                continue
            log = HTTP.get(f"{url}/v1/jobs/{job_id}/logs").text
            results = [ln for ln in log.splitlines() if ln.startswith("result=")]
            assert results, f"job {job_id} printed no result:\n{log}"
            assert int(results[-1].split()[0].split("=")[1]) == expected_result(_steps(int(key)))
        kinds: set[str] = set()
        after = 0
        while True:  # the event stream pages by sequence number
            page = HTTP.get(f"{url}/v1/events", params={"after": after}).json()
            if not page["events"]:
                break
            kinds |= {e["kind"] for e in page["events"]}
            after = page["next"]
        # crashes happened while jobs ran: some survived and were re-adopted
        assert "adopted" in kinds, sorted(kinds)
    finally:
        server.stop()
