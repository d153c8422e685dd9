"""The REST API in-process: FastAPI's TestClient on create_app, a real Store, and a LiveService
with a fake executor, a fake fleet (2 x A100-80GB) and a manual clock.

Every test runs twice: on a SQLite file under tmp_path and on a fresh schema of a throwaway
PostgreSQL server (tests/support/pgserver.py). The scheduler never runs in the background here:
tests call service.step() to let it act.

Each bug these tests found was fixed; the tests stay as its guard.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from api_harness import JSON_CT, NODE, Api, bearer, team_token
from gpupool.server.api.limits import MAX_BODY_BYTES
from gpupool.server.store import Store
from pgserver import fresh_schema, pg_url  # noqa: F401


# ---- the job lifecycle through the API --------------------------------------------------------
def test_submit_run_succeed(api: Api) -> None:
    r = api.submit(name="train-1", gpus=1)
    assert r.status_code == 201, r.text
    job = r.json()
    assert isinstance(job["id"], int)
    assert job["state"] == "pending"
    assert job["name"] == "train-1"
    assert job["team"] == "nlp"
    assert job["gpus"] == []
    assert job["preempting"] is False
    assert api.job(job["id"]) == job
    assert api.events(job["id"]) == ["submitted"]

    api.step()
    running = api.job(job["id"])
    assert running["state"] == "running"
    assert running["attempts"] == 1
    assert len(running["gpus"]) == 1
    assert set(running["gpus"][0]) == {"node", "index"}
    assert running["gpus"][0]["node"] == NODE
    assert running["gpus"][0]["index"] in (0, 1)
    assert running["started_at"] is not None
    assert ("launch", str(job["id"])) in api.executor.calls

    api.executor.finish(str(job["id"]))
    api.step()
    done = api.job(job["id"])
    assert done["state"] == "succeeded"
    assert done["exit_code"] == 0
    assert done["ended_at"] is not None
    assert api.events(job["id"]) == ["submitted", "running", "succeeded"]


def test_defaults_and_named_priorities(api: Api) -> None:
    job = api.submitted(command=["/usr/bin/python3", "x.py"], priority="high")
    assert job["name"] == "python3"  # the program's base name
    assert job["priority"] == 100
    assert job["kind"] == "training"
    assert job["gpu_count"] == 1
    assert job["grace_s"] == 60.0
    assert api.submitted(priority="low")["priority"] == 0
    assert api.submitted(priority=-7)["priority"] == -7


def test_an_accepted_job_is_durable_before_the_answer(
    api: Api, open_store: Callable[[], Store]
) -> None:
    r = api.submit(name="durable", env={"SEED": "1"})
    assert r.status_code == 201
    other = open_store()  # a different engine: sees only what was committed
    row = other.jobs.get(r.json()["id"])
    assert row.state == "pending"
    assert row.name == "durable"
    assert row.command == ("python", "train.py")
    assert dict(row.env) == {"SEED": "1"}
    kinds = [e.kind for e in other.events.after(0, job_id=row.id)]
    assert kinds == ["submitted"]


def test_batch_submits_all_or_nothing(api: Api) -> None:
    r = api.client.post(
        "/v1/jobs/batch",
        json={"jobs": [{"command": ["a"], "team": "nlp"}, {"command": ["b"], "team": "cv"}]},
    )
    assert r.status_code == 201, r.text
    jobs = r.json()["jobs"]
    assert [j["state"] for j in jobs] == ["pending", "pending"]
    assert [j["team"] for j in jobs] == ["nlp", "cv"]
    before_jobs, before_events = api.n_jobs(), api.n_events()
    bad = api.client.post(
        "/v1/jobs/batch",
        json={"jobs": [{"command": ["a"], "team": "nlp"}, {"command": [], "team": "nlp"}]},
    )
    assert bad.status_code == 422
    assert ["body", "jobs", 1, "command"] in [e["loc"] for e in bad.json()["detail"]]
    assert api.client.post("/v1/jobs/batch", json={"jobs": []}).status_code == 422
    assert (api.n_jobs(), api.n_events()) == (before_jobs, before_events)


def test_list_filters_and_pages(api: Api) -> None:
    ids = [api.submitted(team=t)["id"] for t in ("nlp", "cv", "nlp")]
    api.step()  # two start on the two GPUs, one waits
    listed = api.client.get("/v1/jobs").json()["jobs"]
    assert [j["id"] for j in listed] == ids
    nlp = api.client.get("/v1/jobs", params={"team": "nlp"}).json()["jobs"]
    assert [j["id"] for j in nlp] == [ids[0], ids[2]]
    running = api.client.get("/v1/jobs", params={"state": "RUNNING"}).json()["jobs"]
    assert [j["id"] for j in running] == ids[:2]
    page = api.client.get("/v1/jobs", params={"limit": 1, "after": ids[0]}).json()["jobs"]
    assert [j["id"] for j in page] == [ids[1]]
    bad = api.client.get("/v1/jobs", params={"state": "sleeping"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["query", "state"]
    assert api.client.get("/v1/jobs", params={"limit": 0}).status_code == 422
    assert api.client.get("/v1/jobs/999999").status_code == 404


# ---- idempotency ------------------------------------------------------------------------------
def test_idempotency_key_returns_the_first_job(api: Api) -> None:
    key = {"Idempotency-Key": "submit-7f3a"}
    first = api.submit(headers=key, name="once")
    assert first.status_code == 201, first.text
    again = api.submit(headers=key, name="once")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert api.n_jobs() == 1
    assert api.events(first.json()["id"]) == ["submitted"]

    different = api.submit(headers=key, name="once", gpus=2)
    assert different.status_code == 409, different.text
    assert str(first.json()["id"]) in different.json()["detail"]
    assert api.n_jobs() == 1

    # without the key the same body is a new job
    assert api.submit(name="once").status_code == 201
    assert api.n_jobs() == 2


def test_idempotency_key_survives_the_job_running(api: Api) -> None:
    key = {"Idempotency-Key": "k-running"}
    job = api.submit(headers=key).json()
    api.step()
    again = api.submit(headers=key)
    assert again.status_code == 200
    assert again.json()["id"] == job["id"]
    assert again.json()["state"] == "running"
    assert api.n_jobs() == 1


# ---- validation -------------------------------------------------------------------------------
INVALID = [
    ("gpus", {"gpus": -1}),
    ("command", {"command": []}),
    ("command", {"command": ["echo", "a\x00b"]}),
    ("command", {"command": "python train.py"}),
    ("kind", {"kind": "quantum"}),
    ("colour", {"colour": "blue"}),
    ("priority", {"priority": "urgent"}),
    ("priority", {"priority": 5000}),
    ("env", {"env": {"1BAD": "x"}}),
    ("env", {"env": {"OK": "a\x00b"}}),
    ("team", {"team": "bad team"}),
    ("name", {"name": "x\x00"}),
    ("cwd", {"cwd": "/tmp/\x00"}),
    ("grace_s", {"grace_s": -1}),
    ("checkpoint_every_s", {"checkpoint_every_s": 0}),
    ("max_retries", {"max_retries": 101}),
]


@pytest.mark.parametrize(
    ("field_name", "change"), INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)]
)
def test_invalid_spec_gets_422_naming_the_field(
    api: Api, field_name: str, change: dict[str, Any]
) -> None:
    before_jobs, before_events = api.n_jobs(), api.n_events()
    r = api.submit(**change)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail
    locs = [e["loc"] for e in detail]
    assert any(loc[:2] == ["body", field_name] for loc in locs), locs
    assert all(e["msg"] for e in detail)
    assert (api.n_jobs(), api.n_events()) == (before_jobs, before_events)


def test_env_name_message_says_what_is_wrong(api: Api) -> None:
    r = api.submit(env={"1BAD": "x"})
    assert r.status_code == 422
    assert "1BAD" in r.json()["detail"][0]["msg"]


def test_team_is_required_without_a_team_token(api: Api) -> None:
    r = api.client.post("/v1/jobs", json={"command": ["x"]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "team"]
    assert api.n_jobs() == 0


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b"null", b'{"command": ["x"], "team": "nlp"', b"\xff\xfe\x00"],
    ids=["empty", "text", "list", "null", "truncated", "binary"],
)
def test_malformed_bodies_are_client_errors(api: Api, body: bytes) -> None:
    r = api.client.post("/v1/jobs", content=body, headers=JSON_CT)
    assert 400 <= r.status_code < 500, r.text
    assert api.n_jobs() == 0
    assert api.n_events() == 0


# ---- the body limit ---------------------------------------------------------------------------
def test_body_over_64_kib_gets_413(api: Api) -> None:
    r = api.submit(command=["echo", "x" * (MAX_BODY_BYTES + 1)])
    assert r.status_code == 413, r.text[:200]
    assert "65536" in r.json()["detail"]
    many = {"jobs": [{"command": ["echo", "y" * 200], "team": "nlp"}] * 400}
    r = api.client.post("/v1/jobs/batch", json=many)
    assert r.status_code == 413
    assert api.n_jobs() == 0
    assert api.n_events() == 0


def _chunks(total: int) -> Iterator[bytes]:
    """A job body of about `total` bytes, sent in pieces (chunked: no Content-Length)."""
    yield b'{"team": "nlp", "command": ["echo"'
    for _ in range(total // 4000):
        yield b', "' + b"z" * 3994 + b'"'
    yield b"]}"


def test_streamed_body_under_the_limit_is_accepted(api: Api) -> None:
    r = api.client.post("/v1/jobs", content=_chunks(8 * 4096), headers=JSON_CT)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 201, r.text[:200]
    assert api.n_jobs() == 1


def test_streamed_body_over_the_limit_is_refused_and_writes_nothing(api: Api) -> None:
    r = api.client.post("/v1/jobs", content=_chunks(MAX_BODY_BYTES + 8192), headers=JSON_CT)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert 400 <= r.status_code < 500
    assert api.n_jobs() == 0
    assert api.n_events() == 0


def test_streamed_body_over_the_limit_gets_413(api: Api) -> None:
    r = api.client.post("/v1/jobs", content=_chunks(MAX_BODY_BYTES + 8192), headers=JSON_CT)
    assert r.status_code == 413, r.text


# ---- authentication and authorisation ---------------------------------------------------------
def test_no_token_or_an_unknown_one_gets_401(secured: Api) -> None:
    c = secured.client
    for headers in ({}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Bearer"}):
        r = c.get("/v1/jobs", headers=headers)
        assert r.status_code == 401, headers
        assert "GPUPOOL_TOKEN" in r.json()["detail"]
    r = c.get("/v1/jobs", headers=bearer("gp_not-a-real-token"))
    assert r.status_code == 401
    assert "unknown token" in r.json()["detail"]
    r = c.post("/v1/jobs", json={"command": ["x"], "team": "nlp"})
    assert r.status_code == 401
    assert secured.n_jobs() == 0
    assert c.get("/healthz").status_code == 200  # liveness needs no token


def test_admin_token_does_everything(secured: Api) -> None:
    h = secured.headers
    job = secured.submitted(team="cv")
    assert secured.submit(team=None).status_code == 422  # an admin has no team to default to
    secured.step()
    (secured.service.config.run_dir(job["id"]) / "stdout.log").write_bytes(b"ok\n")
    assert secured.client.get(f"/v1/jobs/{job['id']}/logs", headers=h).text == "ok\n"
    assert len(secured.client.get("/v1/jobs", headers=h).json()["jobs"]) == 1
    assert secured.client.get("/v1/cluster", headers=h).status_code == 200
    assert secured.client.get("/v1/events", headers=h).status_code == 200
    r = secured.client.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 200
    r = secured.client.post("/v1/tokens", json={"name": "ops", "team": None}, headers=h)
    assert r.status_code == 201
    assert r.json()["token"].startswith("gp_")
    dup = secured.client.post("/v1/tokens", json={"name": "ops"}, headers=h)
    assert dup.status_code == 409
    bad = secured.client.post("/v1/tokens", json={"name": "no spaces"}, headers=h)
    assert bad.status_code == 422


def test_team_token_submits_and_cancels_only_for_its_team(secured: Api) -> None:
    nlp = team_token(secured, "nlp")
    cv_job = secured.submitted(team="cv")

    mine = secured.submit(headers=nlp, team=None)
    assert mine.status_code == 201, mine.text
    assert mine.json()["team"] == "nlp"  # defaults to the token's team
    assert secured.submit(headers=nlp, team="nlp").status_code == 201
    before = secured.n_jobs()
    foreign = secured.submit(headers=nlp, team="cv")
    assert foreign.status_code == 403
    assert "nlp" in foreign.json()["detail"]
    batch = secured.client.post(
        "/v1/jobs/batch",
        json={"jobs": [{"command": ["a"]}, {"command": ["b"], "team": "cv"}]},
        headers=nlp,
    )
    assert batch.status_code == 403
    assert secured.n_jobs() == before

    # the whole queue is visible, other teams' jobs included
    listed = secured.client.get("/v1/jobs", headers=nlp).json()["jobs"]
    assert cv_job["id"] in [j["id"] for j in listed]
    assert secured.job(cv_job["id"], headers=nlp)["team"] == "cv"

    r = secured.client.post(f"/v1/jobs/{cv_job['id']}/cancel", headers=nlp)
    assert r.status_code == 403
    assert secured.job(cv_job["id"])["state"] == "pending"
    r = secured.client.get(f"/v1/jobs/{cv_job['id']}/logs", headers=nlp)
    assert r.status_code == 403

    r = secured.client.post(f"/v1/jobs/{mine.json()['id']}/cancel", headers=nlp)
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"

    r = secured.client.post("/v1/tokens", json={"name": "sneaky"}, headers=nlp)
    assert r.status_code == 403
    assert secured.store.auth.principal("sneaky") is None


# ---- cancel -----------------------------------------------------------------------------------
def test_cancel_a_pending_job_at_once(api: Api) -> None:
    job = api.submitted()
    r = api.client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"
    assert r.json()["ended_at"] is not None
    assert api.job(job["id"])["state"] == "cancelled"
    api.step()
    assert api.job(job["id"])["state"] == "cancelled"
    assert ("launch", str(job["id"])) not in api.executor.calls
    again = api.client.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 200
    assert again.json()["state"] == "cancelled"
    assert api.client.post("/v1/jobs/424242/cancel").status_code == 404


def test_cancel_a_running_job_when_it_exits(api: Api) -> None:
    job = api.submitted()
    api.step()
    r = api.client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200
    assert r.json()["state"] == "running"
    assert r.json()["preempting"] is False
    assert api.job(job["id"])["state"] == "running"
    assert ("cancel", str(job["id"])) in api.executor.calls
    api.step()  # the fake exits at once on a cancel: the next poll sees it
    done = api.job(job["id"])
    assert done["state"] == "cancelled"
    assert done["reason"] == "cancelled on request"
    assert api.events(job["id"]) == ["submitted", "running", "cancel-requested", "cancelled"]
    # its GPU is free again: the next job starts on it
    nxt = api.submitted(gpus=2)
    api.step()
    assert api.job(nxt["id"])["state"] == "running"


# ---- logs -------------------------------------------------------------------------------------
def test_logs_read_with_offsets(secured: Api) -> None:
    h = secured.headers
    job = secured.submitted()
    logs = f"/v1/jobs/{job['id']}/logs"
    empty = secured.client.get(logs, headers=h)  # pending: no run directory yet
    assert empty.status_code == 200
    assert empty.text == ""
    assert empty.headers["X-Log-Offset"] == "0"
    assert empty.headers["X-Job-State"] == "pending"

    secured.step()
    run_dir = secured.service.config.run_dir(job["id"])
    (run_dir / "stdout.log").write_bytes(b"epoch 1\n")
    (run_dir / "stderr.log").write_bytes(b"warning: slow\n")
    first = secured.client.get(logs, headers=h)
    assert first.status_code == 200
    assert first.text == "epoch 1\n"
    assert first.headers["X-Log-Offset"] == "8"
    assert first.headers["X-Job-State"] == "running"
    assert first.headers["content-type"].startswith("text/plain")

    with (run_dir / "stdout.log").open("ab") as f:
        f.write(b"epoch 2\n")
    nxt = secured.client.get(logs, params={"offset": 8}, headers=h)
    assert nxt.text == "epoch 2\n"
    assert nxt.headers["X-Log-Offset"] == "16"
    end = secured.client.get(logs, params={"offset": 16}, headers=h)
    assert end.text == ""
    assert end.headers["X-Log-Offset"] == "16"
    part = secured.client.get(logs, params={"offset": 2, "limit": 3}, headers=h)
    assert part.text == "och"
    assert part.headers["X-Log-Offset"] == "5"

    err = secured.client.get(logs, params={"stream": "stderr"}, headers=h)
    assert err.text == "warning: slow\n"
    assert err.headers["X-Log-Offset"] == str(len(b"warning: slow\n"))
    assert secured.client.get(logs, params={"stream": "stdin"}, headers=h).status_code == 422
    assert secured.client.get(logs, params={"offset": -1}, headers=h).status_code == 422
    assert secured.client.get("/v1/jobs/99999/logs", headers=h).status_code == 404

    cv = team_token(secured, "cv")
    r = secured.client.get(logs, headers=cv)
    assert r.status_code == 403
    assert "epoch" not in r.text
    assert secured.client.get(logs, headers=team_token(secured, "nlp")).text == "epoch 1\nepoch 2\n"


# ---- cluster, events, metrics, health, OpenAPI ------------------------------------------------
def test_cluster_shows_the_gpus_with_telemetry(api: Api) -> None:
    job = api.submitted()
    api.step(2)  # started, then sampled under its load
    view = api.client.get("/v1/cluster").json()
    gpus = [g for n in view["nodes"] for g in n["gpus"]]
    assert len(gpus) == 2
    assert [n["name"] for n in view["nodes"]] == [NODE]
    assert view["nodes"][0]["healthy"] is True
    for g in gpus:
        assert g["model"] == "A100-80GB"
        assert g["healthy"] is True
        assert g["uuid"]
        assert g["mem_total_mib"] > 0
        for key in ("util_pct", "mem_used_mib", "temp_c", "power_w", "power_limit_w"):
            assert isinstance(g[key], int | float), key
    busy = [g for g in gpus if g["job_id"] == job["id"]]
    assert len(busy) == 1
    assert busy[0]["index"] == api.job(job["id"])["gpus"][0]["index"]
    assert busy[0]["util_pct"] > 0
    assert view["queue"] == {"pending": 0, "running": 1}
    assert view["scheduler_error"] is None


def test_events_page_with_after_and_next(api: Api) -> None:
    ids = [api.submitted()["id"] for _ in range(3)]
    page = api.client.get("/v1/events").json()
    events = page["events"]
    assert [e["kind"] for e in events] == ["submitted"] * 3
    assert [e["job_id"] for e in events] == ids
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert page["next"] == seqs[-1]
    rest = api.client.get("/v1/events", params={"after": seqs[0]}).json()
    assert [e["seq"] for e in rest["events"]] == seqs[1:]
    api.step()
    newer = api.client.get("/v1/events", params={"after": page["next"]}).json()
    # two GPUs: the third job waits, and its first reason code is an event (the review's)
    assert [e["kind"] for e in newer["events"]] == ["running", "running", "wait-reason"]
    assert newer["next"] > page["next"]
    none = api.client.get("/v1/events", params={"after": newer["next"]}).json()
    assert none == {"events": [], "next": newer["next"]}
    assert api.client.get("/v1/events", params={"after": -1}).status_code == 422
    assert api.client.get("/v1/events", params={"wait": 31}).status_code == 422


def test_metrics_in_dcgm_and_gpupool_form(api: Api) -> None:
    api.submitted(team="nlp")
    api.submitted(team="nlp", kind="batch")
    api.submitted(team="cv", gpus=2)
    api.step()
    text = api.client.get("/metrics")
    assert text.status_code == 200
    assert text.headers["content-type"] == CONTENT_TYPE_LATEST
    lines = text.text.splitlines()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.text)
        for s in f.samples
    }
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"):
        assert f"# TYPE {name} gauge" in lines
        gpus = {dict(labels)["gpu"]: dict(labels) for (n, labels) in samples if n == name}
        assert set(gpus) == {"0", "1"}, name
        for gpu, labels in gpus.items():  # the DCGM exporter's labels, no others
            assert set(labels) == {"gpu", "UUID", "modelName", "Hostname"}, (name, gpu)
            assert labels["UUID"] and labels["modelName"] == "A100-80GB", (name, gpu)
            assert labels["Hostname"] == NODE, (name, gpu)

    def jobs(team: str, kind: str, state: str) -> float | None:
        key = (("kind", kind), ("state", state), ("team", team))
        return samples.get(("gpupool_jobs", key))

    assert jobs("nlp", "training", "running") == 1
    assert jobs("nlp", "batch", "running") == 1
    assert jobs("cv", "training", "pending") == 1
    assert samples[("gpupool_queue_pending", ())] == 1
    assert samples[("gpupool_nodes_unhealthy", ())] == 0


def test_healthz(api: Api) -> None:
    r = api.client.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] is True and body["scheduler_error"] is None
    assert body["role"] == "active" and body["problem"] is None
    assert body["loop"]["running"] is False  # tests step the service themselves


def test_openapi_lists_the_job_paths(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    paths = doc["paths"]
    assert {"post", "get"} <= set(paths["/v1/jobs"])
    assert "post" in paths["/v1/jobs/batch"]
    assert "get" in paths["/v1/jobs/{job_id}"]
    assert "post" in paths["/v1/jobs/{job_id}/cancel"]
    assert "get" in paths["/v1/jobs/{job_id}/logs"]
    assert {"/v1/cluster", "/v1/events", "/v1/tokens", "/healthz", "/metrics"} <= set(paths)
    schema = json.dumps(paths["/v1/jobs"]["post"]["requestBody"])
    assert "JobIn" in schema
    assert set(doc["components"]["schemas"]["JobIn"]["required"]) == {"command"}


# ---- failures: a lost node, retries -----------------------------------------------------------
def test_a_failed_gpu_is_drained_alone_and_its_job_resumes_on_the_other(api: Api) -> None:
    job = api.submitted()
    api.step()
    device = api.job(job["id"])["gpus"][0]["index"]
    other = 1 - device
    api.telemetry.fail_gpu(device)
    api.step()  # sampled: the GPU is out of the pool and its job told to stop
    api.step()  # its exit is reaped: requeued, and resumed on the node's other GPU
    row = api.job(job["id"])
    assert row["state"] == "running" and row["attempts"] == 2
    assert [g["index"] for g in row["gpus"]] == [other]
    suspended = [e for e in api.store.events.after(0, job_id=job["id"]) if e.kind == "suspended"]
    assert f"GPU {device} of node {NODE} unhealthy" in suspended[0].message
    view = api.client.get("/v1/cluster").json()
    node = view["nodes"][0]
    assert node["healthy"] is True and node["state"] == "up"  # the node works on
    assert [o["gpu"] for o in node["gpus_out"]] == [device]
    assert "fell off the bus" in node["gpus_out"][0]["reason"]
    by_index = {g["index"]: g for g in node["gpus"]}
    assert by_index[device]["healthy"] is False and by_index[device]["out"] is True
    assert by_index[device]["job_id"] is None
    assert by_index[other]["out"] is False and by_index[other]["job_id"] == job["id"]
    metrics = api.client.get("/metrics").text.splitlines()
    assert "gpupool_nodes_unhealthy 0.0" in metrics
    assert "gpupool_gpus_out 1.0" in metrics
    kinds = [e["kind"] for e in api.client.get("/v1/events").json()["events"]]
    assert "gpu-unhealthy" in kinds and "node-unhealthy" not in kinds
    # a second job finds no room: the failed GPU takes nothing new, and `why` says so
    second = api.submitted()
    api.step(3)
    waiting = api.job(second["id"])
    assert waiting["state"] == "pending"
    assert f"GPU {device} of node {NODE} unhealthy" in waiting["reason"]
    # the GPU recovers: it is taken back and the second job starts there
    api.telemetry.repair(device)
    api.step()  # sampled healthy: the GPU comes back
    api.step()  # the cycle starts the second job there
    node = api.client.get("/v1/cluster").json()["nodes"][0]
    assert node["gpus_out"] == []
    row = api.job(second["id"])
    assert row["state"] == "running" and [g["index"] for g in row["gpus"]] == [device]
    kinds = [e["kind"] for e in api.client.get("/v1/events").json()["events"]]
    assert "gpu-healthy" in kinds


def test_failed_job_is_retried_then_fails(api: Api) -> None:
    job = api.submitted(max_retries=1)
    api.step()
    api.executor.finish(str(job["id"]), exit_code=3)
    api.step()  # reaped: back to the queue (suspended), and resumed in the same cycle
    row = api.job(job["id"])
    assert row["state"] == "running"
    assert row["retries"] == 1
    assert row["attempts"] == 2
    assert api.events(job["id"]) == ["submitted", "running", "suspended", "running"]
    suspended = [e for e in api.store.events.after(0, job_id=job["id"]) if e.kind == "suspended"]
    assert "retry 1 of 1" in suspended[0].message
    assert "exited 3" in suspended[0].message

    api.executor.finish(str(job["id"]), exit_code=3)
    api.step()
    row = api.job(job["id"])
    assert row["state"] == "failed"
    assert row["exit_code"] == 3
    assert "exited 3" in row["reason"]
    assert row["ended_at"] is not None
    api.step()
    assert api.job(job["id"])["state"] == "failed"


def test_a_job_too_big_for_the_machine_is_refused_at_submit(api: Api) -> None:
    r = api.submit(gpus=3)
    assert r.status_code == 422
    assert "asks for 3 GPUs on one node; the largest node has 2" in r.json()["detail"]
    assert api.client.get("/v1/jobs", headers=api.headers).json()["jobs"] == []


# ---- concurrent submissions (group commit) ----------------------------------------------------
WARM_UP = {"command": ["warm-up"], "team": "nlp"}
Post = tuple[dict[str, Any], dict[str, str]]
"""A JSON body and the headers to POST it with."""


@contextmanager
def held_commits(store: Store) -> Iterator[tuple[threading.Event, list[int]]]:
    """Submission commits wait for the event; the list records each group's size."""
    release = threading.Event()
    sizes: list[int] = []
    jobs = type(store.jobs)
    original = jobs.submit_group

    def gated(self: Any, items: Any, now_s: float) -> Any:
        sizes.append(len(items))
        release.wait(30)
        return original(self, items, now_s)

    jobs.submit_group = gated  # type: ignore[method-assign]
    try:
        yield release, sizes
    finally:
        release.set()
        jobs.submit_group = original  # type: ignore[method-assign]


async def _settle() -> None:
    """Let every ready task run until it blocks (the app does no I/O before the batcher)."""
    for _ in range(200):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)


def post_together(api: Api, posts: list[Post], one_group: bool) -> list[httpx.Response]:
    """POST /v1/jobs concurrently on one event loop. one_group: a warm-up submission holds
    the first commit until all `posts` are queued, so they share the second commit."""

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=api.client.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:

            def post(body: dict[str, Any], headers: dict[str, str]) -> asyncio.Task[Any]:
                return asyncio.create_task(c.post("/v1/jobs", json=body, headers=headers))

            if not one_group:
                return list(await asyncio.gather(*(post(b, h) for b, h in posts)))
            with held_commits(api.store) as (release, sizes):
                warm = post(WARM_UP, {})
                await _settle()
                tasks = [post(b, h) for b, h in posts]
                await _settle()
                release.set()
                assert (await warm).status_code == 201
                out = list(await asyncio.gather(*tasks))
            assert sizes == [1, len(posts)], sizes  # the posts did share one commit
            return out

    return asyncio.run(main())


@pytest.mark.parametrize("one_group", [False, True], ids=["as-they-come", "one-group"])
def test_concurrent_submissions_each_get_their_own_job(api: Api, one_group: bool) -> None:
    posts: list[Post] = [({"command": ["job", str(i)], "team": "nlp"}, {}) for i in range(12)]
    answers = post_together(api, posts, one_group)
    assert [r.status_code for r in answers] == [201] * 12
    ids = [r.json()["id"] for r in answers]
    assert len(set(ids)) == 12
    assert [r.json()["command"] for r in answers] == [["job", str(i)] for i in range(12)]
    other = Store(api.url)  # all committed
    try:
        for r in answers:
            row = other.jobs.get(r.json()["id"])
            assert list(row.command) == r.json()["command"]
            assert [e.kind for e in other.events.after(0, job_id=row.id)] == ["submitted"]
    finally:
        other.close()
    assert api.n_jobs() == 12 + one_group
    assert api.n_events() == api.n_jobs()


@pytest.mark.parametrize("one_group", [False, True], ids=["as-they-come", "one-group"])
def test_concurrent_retries_with_one_idempotency_key(api: Api, one_group: bool) -> None:
    body = {"command": ["train"], "team": "nlp"}
    key = {"Idempotency-Key": "retry-storm"}
    answers = post_together(api, [(body, key)] * 6, one_group)
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 5 + [201], statuses
    assert len({r.json()["id"] for r in answers}) == 1
    assert api.n_jobs() == 1 + one_group
    assert api.n_events() == api.n_jobs()


def test_same_key_different_bodies_in_one_group(api: Api) -> None:
    key = {"Idempotency-Key": "k-mixed"}
    posts = [({"command": ["a"], "team": "nlp"}, key), ({"command": ["b"], "team": "nlp"}, key)]
    answers = post_together(api, posts, one_group=True)
    assert sorted(r.status_code for r in answers) == [201, 409]
    assert api.n_jobs() == 2  # the warm-up and the first of the two


def test_a_failed_group_commit_falls_back_to_one_by_one(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group commit that fails as a whole (one item the database refuses, or a hiccup)
    is retried one submission at a time: the good ones still get their job."""

    def broken(self: object, items: object, now_s: float) -> object:
        raise RuntimeError("the database refused one row of the group")

    monkeypatch.setattr(type(api.store.jobs), "submit_group", broken)
    good: list[Post] = [({"command": ["ok", str(i)], "team": "nlp"}, {}) for i in range(3)]
    answers = post_together(api, good, one_group=False)
    assert [r.status_code for r in answers] == [201] * 3
    assert len({r.json()["id"] for r in answers}) == 3
    assert len(api.store.jobs.list()) == 3


def test_batch_submission_wakes_the_scheduler(api: Api) -> None:
    api.service.state.wake.clear()
    r = api.client.post("/v1/jobs/batch", json={"jobs": [{"command": ["x"], "team": "nlp"}]})
    assert r.status_code == 201
    assert api.service.state.wake.is_set()


def test_submission_wakes_the_scheduler(api: Api) -> None:
    api.service.state.wake.clear()
    assert api.submit().status_code == 201
    assert api.service.state.wake.is_set()


# ---- bugs -------------------------------------------------------------------------------------
UNRENDERABLE = [
    pytest.param(b'{"command": ["x"], "team": "nlp", "grace_s": NaN}', JSON_CT, id="nan-field"),
    pytest.param(b'{"command": ["x"], "team": "nlp", "priority": Infinity}', JSON_CT, id="inf"),
    pytest.param(b'{"command": ["x"], "team": "nlp", "colour": -Infinity}', JSON_CT, id="-inf"),
    pytest.param(b"NaN", JSON_CT, id="nan-body"),
    pytest.param(b'{"command": ["\\ud800"], "team": "nlp"}', JSON_CT, id="surrogate"),
    pytest.param(b'{"command": ["x"], "team": "nlp", "gpu_model": "\\udfff"}', JSON_CT, id="sur2"),
    pytest.param(b"\x80", {}, id="raw-bytes"),
    pytest.param(b"\xff\xfe", {"content-type": "text/plain"}, id="text-bytes"),
]
"""Bodies whose 422 would have to quote a value JSON cannot carry: NaN, +-Infinity, a lone
UTF-16 surrogate, bytes that are not UTF-8 in a body not declared JSON."""


@pytest.mark.parametrize(("body", "headers"), UNRENDERABLE)
def test_unrenderable_inputs_write_nothing(api: Api, body: bytes, headers: dict[str, str]) -> None:
    r = api.client.post("/v1/jobs", content=body, headers=headers)
    assert r.status_code != 201
    assert api.n_jobs() == 0
    assert api.n_events() == 0


@pytest.mark.parametrize(("body", "headers"), UNRENDERABLE)
def test_unrenderable_inputs_get_422(api: Api, body: bytes, headers: dict[str, str]) -> None:
    r = api.client.post("/v1/jobs", content=body, headers=headers)
    assert r.status_code == 422, r.text


BIG = 2**63  # one past SQLite's INTEGER and PostgreSQL's bigint


@pytest.mark.parametrize(
    ("method", "path", "ok"),
    [
        ("GET", f"/v1/jobs/{BIG}", (404, 422)),
        ("POST", f"/v1/jobs/{BIG}/cancel", (404, 422)),
        ("GET", f"/v1/jobs/{BIG}/logs", (404, 422)),
        ("GET", f"/v1/jobs?after={BIG}", (200, 422)),
        ("GET", f"/v1/events?after={BIG}", (200, 422)),
    ],
    ids=["job", "cancel", "logs", "jobs-after", "events-after"],
)
def test_ids_beyond_64_bits_are_client_errors(
    api: Api, method: str, path: str, ok: tuple[int, ...]
) -> None:
    api.submitted()
    r = api.client.request(method, path)
    assert r.status_code in ok, (r.status_code, r.text)


@pytest.mark.parametrize("path", ["/v1/jobs/{big}", "/v1/jobs/{big}/logs", "/v1/jobs?after={big}"])
def test_ids_beyond_32_bits(api: Api, db: str, request: pytest.FixtureRequest, path: str) -> None:
    api.submitted()
    r = api.client.get(path.format(big=2**31))
    assert r.status_code < 500, r.text


@pytest.mark.parametrize("offset", [2**62, 2**63 - 1, 2**64])
def test_log_offset_far_past_the_end(api: Api, offset: int) -> None:
    job = api.submitted()
    api.step()
    (api.service.config.run_dir(job["id"]) / "stdout.log").write_bytes(b"hello\n")
    r = api.client.get(f"/v1/jobs/{job['id']}/logs", params={"offset": offset})
    assert r.status_code == 200, r.text
    assert r.text == ""


def test_nul_in_gpu_model_is_refused(api: Api) -> None:
    r = api.submit(gpu_model="A100\x00")
    assert r.status_code == 422, r.text
    assert ["body", "gpu_model"] in [e["loc"] for e in r.json()["detail"]]


def test_nul_in_gpu_model_leaves_no_half_written_row(api: Api) -> None:
    r = api.submit(gpu_model="A100\x00")
    assert api.n_jobs() == (1 if r.status_code == 201 else 0)
    assert api.n_events() == api.n_jobs()


def test_nul_in_team_filter(api: Api, db: str, request: pytest.FixtureRequest) -> None:
    r = api.client.get("/v1/jobs", params={"team": "nlp\x00"})
    assert r.status_code < 500, r.text


def test_missing_working_directory_does_not_wedge_the_scheduler(api: Api, tmp_path: Path) -> None:
    bad = api.submit(cwd=str(tmp_path / "no-such-dir"))
    good = api.submitted()
    if bad.status_code == 201:
        api.step(2)  # must not raise
        row = api.job(bad.json()["id"])
        assert row["state"] == "failed"
        assert "no-such-dir" in row["reason"]
    else:
        assert bad.status_code == 422
        api.step(2)
    assert api.job(good["id"])["state"] == "running"


def test_a_slow_database_read_does_not_stall_other_requests(
    make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event poll and the token lookup read the database off the event loop: while
    one is held in a slow read, a health check on the same loop answers. The read is
    released only after the health check answered (or after hold_s, when the loop is
    blocked and no answer can come), so the order of the two proves it, however loaded
    the machine is."""
    api = make_api(auth=True)
    hold_s = 5.0
    release = threading.Event()
    order: list[str] = []

    def held(read: Callable[..., Any]) -> Callable[..., Any]:
        def slow(*args: Any, **kw: Any) -> Any:
            order.append("read-held")
            release.wait(hold_s)
            order.append("read-done")
            return read(*args, **kw)

        return slow

    app = api.client.app

    async def race(path: str, headers: dict[str, str]) -> list[str]:
        order.clear()
        release.clear()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            slow = asyncio.create_task(client.get(path, headers=headers))
            for _ in range(500):  # bounded: at most about 5 s until the read is held
                if order:
                    break
                await asyncio.sleep(0.01)
            health = await client.get("/healthz")
            order.append("health-answered")
            assert health.status_code == 200
            release.set()
            await slow
        return list(order)

    # a loop blocked by the read answers the health check only after the read is done
    with monkeypatch.context() as patch:
        patch.setattr(type(api.store.events), "after", held(type(api.store.events).after))
        assert race_order(asyncio.run(race("/v1/events", api.headers))) == "health-first"
    with monkeypatch.context() as patch:
        patch.setattr(type(api.store.auth), "principal", held(type(api.store.auth).principal))
        assert race_order(asyncio.run(race("/v1/jobs", bearer("gp_not_a_token")))) == (
            "health-first"
        )


def race_order(order: list[str]) -> str:
    """Whether the health check answered while the first slow read was still held."""
    assert order and order[0] == "read-held", order
    answered, done = order.index("health-answered"), order.index("read-done")
    return "health-first" if answered < done else f"read-first: {order}"
