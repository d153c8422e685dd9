"""Fair when the pool is full, through a real `gpupool serve` on a fake fleet: one user's
twenty jobs do not all go ahead of another user's one (fair share inside a team), and a
wide job behind a stream of narrow ones keeps its GPUs once they free (a reservation,
`gpupool why` tells it) while a narrow job that ends in time still backfills. GPUs are
freed by cancelling the jobs on them, so what starts next does not depend on timing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import chromium, watch
from service_proc import HTTP, Server, cli, wait_for

LONG = [sys.executable, "-c", "import time; time.sleep(300)"]
ACTIVE = ("pending", "running", "preempting", "suspended")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(config: str, gpus: str) -> Server:
        path = tmp_path / f"config-{len(started)}.yaml"
        path.write_text(config, encoding="utf-8")
        srv = Server(
            tmp_path / f"state-{len(started)}",
            "--auth", "none", "--config", str(path), "--fake-gpus", gpus,
            "--cycle", "0.3", "--sample", "0.3",
        ).start()  # fmt: skip
        started.append(srv)
        return srv

    yield start
    for srv in started:  # the jobs outlive their server: cancel them first
        if srv.proc is None or srv.proc.poll() is not None:
            continue
        for job in _jobs(srv.url):
            if job["state"] in ACTIVE:
                HTTP.post(f"{srv.url}/v1/jobs/{job['id']}/cancel", timeout=10)
        wait_for(lambda srv=srv: not _active(srv.url), 30, "the jobs to end")
        srv.stop()


def _jobs(url: str) -> list[dict[str, Any]]:
    body = HTTP.get(f"{url}/v1/jobs", params={"limit": 500}, timeout=10).json()
    return list(body["jobs"])


def _active(url: str) -> list[dict[str, Any]]:
    return [j for j in _jobs(url) if j["state"] in ACTIVE]


def _submit(url: str, **fields: Any) -> int:
    body = {"command": LONG, "team": "ml", **fields}
    r = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _job(url: str, job_id: int) -> dict[str, Any]:
    job: dict[str, Any] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return job


def _running(url: str) -> set[int]:
    return {int(j["id"]) for j in _jobs(url) if j["state"] == "running"}


def _cancel(url: str, *job_ids: int) -> None:
    for job_id in job_ids:
        assert HTTP.post(f"{url}/v1/jobs/{job_id}/cancel", timeout=10).status_code == 200
    for job_id in job_ids:
        wait_for(lambda j=job_id: _job(url, j)["state"] == "cancelled", 30, f"job {job_id} to end")


def test_a_users_one_job_goes_before_another_users_twenty(serve: Any) -> None:
    """Two GPUs, team ml: alice queues 20 jobs, then bob one (`gpupool submit --user bob`).
    When a GPU frees, bob's job takes it, not alice's third."""
    srv = serve("teams:\n  - {name: ml}\n", "2xA100-80GB")
    url = srv.url
    alice = [_submit(url, user="alice", name=f"a{k}") for k in range(20)]
    wait_for(lambda: _running(url) == set(alice[:2]), 60, "alice's first two jobs to run")
    out = cli(url, "submit", "--json", "--team", "ml", "--user", "bob", "--", *LONG)
    assert out.returncode == 0, out.stderr
    bob = int(json.loads(out.stdout)["id"])
    assert _job(url, bob)["user"] == "bob"
    wait_for(lambda: _job(url, bob)["reason_code"] is not None, 30, "bob's job to be seen")
    _cancel(url, alice[0])
    wait_for(lambda: len(_running(url)) == 2, 30, "the freed GPU to be taken")
    assert _running(url) == {alice[1], bob}, [(j["id"], j["user"]) for j in _active(url)][:5]


RESERVING = "reservations: true\n"
"""No teams: the team's maximum would be the pool, and a job held by it waits with QuotaMax."""


def test_a_wide_job_keeps_the_gpus_that_free_and_a_short_job_backfills(serve: Any) -> None:
    """Four GPUs on one node, four 1-GPU jobs with a 1-h limit running. A 4-GPU job
    arrives, then a stream of 1-GPU jobs with 1-h limits and one 1-GPU job with a 10-min
    limit. `gpupool why` shows the wide job's reservation. As the running jobs are
    cancelled, the freed GPUs stay idle for it (the stream's jobs would end after the
    reservation starts), except that the 10-min job backfills one (it ends in time); once
    the last one leaves, the wide job starts while the whole stream still waits."""
    srv = serve(RESERVING, "4xA100-80GB")
    url = srv.url
    hour = {"time_limit_s": 3600.0}
    first = [_submit(url, name=f"n{k}", **hour) for k in range(4)]
    wait_for(lambda: _running(url) == set(first), 60, "the first four jobs to run")
    wide = _submit(url, name="wide", gpus=4, **hour)
    wait_for(lambda: _job(url, wide)["reason_code"] == "Reserved", 30, "the reservation")
    why = cli(url, "why", str(wide))
    assert why.returncode == 0, why.stderr
    assert why.stdout.startswith(f"job {wide} pending: Reserved\n"), why.stdout
    assert "4 A100-80GB GPUs on " in why.stdout, why.stdout
    stream = [_submit(url, name=f"s{k}", **hour) for k in range(6)]
    short = _submit(url, name="short", time_limit_s=600.0)
    _cancel(url, first[0])
    wait_for(lambda: short in _running(url), 30, "the short job to backfill the freed GPU")
    _cancel(url, first[1], first[2])
    wait_for(lambda: "draining" in _job(url, wide)["reason"], 30, "the reservation to drain")
    assert not set(stream) & _running(url)  # the two freed GPUs stay idle for the wide job
    gpus = HTTP.get(f"{url}/v1/cluster", timeout=10).json()["nodes"][0]["gpus"]
    assert [g["reserved_for"] for g in gpus] == [wide] * 4, gpus
    assert sum(g["job_id"] is None for g in gpus) == 2, gpus
    _dashboard_marks_the_reserved_gpus(url, wide)
    _cancel(url, first[3], short)
    wait_for(lambda: wide in _running(url), 30, "the wide job to start")
    assert _running(url) == {wide}
    assert all(_job(url, s)["state"] == "pending" for s in stream)


def _dashboard_marks_the_reserved_gpus(url: str, wide: int) -> None:
    """The dashboard (headless Chromium) badges each GPU kept for the wide job."""
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        seen = watch(page)
        page.goto(url + "/")
        page.wait_for_selector(".gpu.reserved", timeout=10_000)
        badges = page.eval_on_selector_all(
            ".gpu.reserved .badge.kept", "bs => bs.map(b => b.textContent)"
        )
        assert badges == [f"reserved for #{wide}"] * 4, badges
        assert not seen.console_errors, seen.console_errors
        page.close()


RACKS = ("r1", "r2", "r1", "r2")
RACKED_FLEET = ",".join(f"1x2xA100-80GB@rack={rack}" for rack in RACKS)
"""node1..node4, two GPUs each, in racks r1, r2, r1, r2: index order crosses racks."""


def test_a_labelled_fake_fleet_packs_racks_and_checks_what_a_gang_asks(serve: Any) -> None:
    """`--fake-gpus` as nodes with labels: `gpupool nodes` shows them; the second 2-GPU
    job joins the first one's rack (node3) where topology-blind best fit takes the next
    node (node2, the other rack); a gang is refused here with what to do (this service
    runs a job on one machine), and a level the topology lacks is refused by name."""
    srv = serve("teams:\n  - {name: ml}\ntopology: {levels: [rack]}\n", RACKED_FLEET)
    url = srv.url
    nodes = {n["name"]: n["labels"] for n in HTTP.get(f"{url}/v1/cluster").json()["nodes"]}
    assert nodes == {f"node{k}": {"rack": r} for k, r in enumerate(RACKS, start=1)}
    listed = cli(url, "nodes").stdout
    assert "rack=r1" in listed and "rack=r2" in listed, listed
    first = _submit(url, gpus=2)
    wait_for(lambda: first in _running(url), 30, "the first job")
    second = _submit(url, gpus=2)
    wait_for(lambda: second in _running(url), 30, "the second job")
    where = {j: {g["node"] for g in _job(url, j)["gpus"]} for j in (first, second)}
    assert where == {first: {"node1"}, second: {"node3"}}, where
    gang = HTTP.post(
        f"{url}/v1/jobs", json={"command": LONG, "team": "ml", "gpus": 4, "topology": "rack"}
    )
    assert gang.status_code == 422 and "--ray" in gang.text, gang.text
    odd = HTTP.post(
        f"{url}/v1/jobs", json={"command": LONG, "team": "ml", "gpus": 1, "topology": "block"}
    )
    assert odd.status_code == 422 and "no level 'block'" in odd.text, odd.text
    _cancel(url, first, second)
