"""POST /v1/jobs is served by a direct route (routes/jobs.py submit_direct) that skips FastAPI's
per-request parameter solving. It must answer exactly as the documented FastAPI route
would: the same status, the same body, for good submits and for every kind of bad one
(body, header, token). Two apps on two databases, one with the direct route removed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Route

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store, database_url
from head_schema import at_head

T0 = 1_000.0
JSON_CT = {"content-type": "application/json"}


def _app(tmp: Path, direct: bool) -> tuple[TestClient, str]:
    store = Store(at_head(database_url(None, tmp / "db")))
    store.migrate()
    service = LiveService(
        LiveConfig(state_dir=tmp / "state", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        ManualClock(T0),
    )
    app = create_app(service, store, auth=True)
    routes = [r for r in app.router.routes if isinstance(r, Route) and r.path == "/v1/jobs"]
    fast = [r for r in routes if getattr(r.endpoint, "__name__", "") == "submit_direct"]
    assert len(fast) == 1, "the direct route should be registered once"
    if not direct:
        app.router.routes.remove(fast[0])
    token = store.auth.create_token("admin", None, T0)
    store.auth.create_token("nlp-user", "nlp", T0)
    return TestClient(app, raise_server_exceptions=False), token


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[tuple[TestClient, str], tuple[TestClient, str]]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    direct, documented = _app(tmp_path / "a", True), _app(tmp_path / "b", False)
    yield direct, documented
    direct[0].close()
    documented[0].close()


GOOD = {"command": ["python", "train.py"], "team": "nlp", "gpus": 1}

CASES: list[tuple[str, bytes | None, dict[str, str]]] = [
    ("a good submit", json.dumps(GOOD).encode(), {}),
    (
        "every field kind",
        json.dumps(
            {
                **GOOD,
                "name": "x",
                "priority": "high",
                "env": {"A": "1"},
                "duration_s": 60,
                "deadline_at": 2e9,
            }
        ).encode(),
        {},
    ),
    ("no body", None, {}),
    ("an empty body", b"", {}),
    ("not JSON", b"{not json", {}),
    ("a JSON list", b"[]", {}),
    ("a JSON string", b'"x"', {}),
    ("null", b"null", {}),
    ("undecodable bytes", b"\xff\xfe\x00", {}),
    ("truncated", b'{"command": ["x"], "team": "nlp"', {}),
    ("a +json type", json.dumps(GOOD).encode(), {"content-type": "application/x+json"}),
    ("a charset", json.dumps(GOOD).encode(), {"content-type": "application/json; charset=utf-8"}),
    ("a missing command", json.dumps({"team": "nlp"}).encode(), {}),
    ("an unknown field", json.dumps({**GOOD, "colour": "red"}).encode(), {}),
    ("a bad type", json.dumps({**GOOD, "gpus": "two"}).encode(), {}),
    ("NaN", b'{"command": ["x"], "team": "nlp", "duration_s": NaN}', {}),
    ("several errors", json.dumps({"command": [], "gpus": -1, "x": 1}).encode(), {}),
    ("a long key", json.dumps(GOOD).encode(), {"idempotency-key": "k" * 129}),
    ("a key with a space", json.dumps(GOOD).encode(), {"idempotency-key": "a b"}),
    ("a bad key and body", b"{}", {"idempotency-key": "a b"}),
    ("a key", json.dumps(GOOD).encode(), {"idempotency-key": "key-1"}),
    ("no content type", json.dumps(GOOD).encode(), {"content-type": ""}),
    ("text/plain", json.dumps(GOOD).encode(), {"content-type": "text/plain"}),
]


def _ask(client: TestClient, token: str | None, body: bytes | None, extra: dict[str, str]) -> Any:
    headers = {**JSON_CT, **extra}
    if headers.get("content-type") == "":
        del headers["content-type"]
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    r = client.post("/v1/jobs", content=body, headers=headers)
    payload = r.json()
    if isinstance(payload, dict):
        payload.pop("submitted_at", None)  # each app's own clock read
    return r.status_code, payload


@pytest.mark.parametrize(("what", "body", "extra"), CASES, ids=[c[0] for c in CASES])
def test_the_direct_route_answers_as_the_documented_one(
    pair: tuple[tuple[TestClient, str], tuple[TestClient, str]],
    what: str,
    body: bytes | None,
    extra: dict[str, str],
) -> None:
    (direct, t1), (documented, t2) = pair
    assert _ask(direct, t1, body, extra) == _ask(documented, t2, body, extra), what


def test_token_errors_are_the_same(
    pair: tuple[tuple[TestClient, str], tuple[TestClient, str]],
) -> None:
    (direct, _), (documented, _) = pair
    body = json.dumps(GOOD).encode()
    for token in (None, "gp_unknown"):
        got = _ask(direct, token, body, {})
        assert got == _ask(documented, token, body, {})
        assert got[0] == 401


def test_a_repeated_key_gives_the_first_job_back_on_both(
    pair: tuple[tuple[TestClient, str], tuple[TestClient, str]],
) -> None:
    for client, token in pair:
        body = json.dumps(GOOD).encode()
        first = _ask(client, token, body, {"idempotency-key": "same"})
        again = _ask(client, token, body, {"idempotency-key": "same"})
        assert first[0] == 201 and again[0] == 200
        assert first[1]["id"] == again[1]["id"]


def test_repeated_headers_are_read_as_the_documented_route_reads_them(
    pair: tuple[tuple[TestClient, str], tuple[TestClient, str]],
) -> None:
    """The direct route reads its headers in one pass: of a repeated one, the first
    counts, as Starlette's Headers.get gives it to the documented route."""
    body = json.dumps(GOOD).encode()
    answers = []
    for client, token in pair:
        sent = []
        for first, second in [
            ({"idempotency-key": "k-first"}, {"idempotency-key": "a b"}),  # 2nd is invalid
            ({"content-type": "application/json"}, {"content-type": "text/plain"}),
            ({"authorization": f"Bearer {token}"}, {"authorization": "Bearer gp_unknown"}),
        ]:
            headers = [
                ("content-type", "application/json"),
                ("authorization", f"Bearer {token}"),
            ]
            headers = [h for h in headers if h[0] not in first] + [
                *first.items(),
                *second.items(),
            ]
            r = client.post("/v1/jobs", content=body, headers=headers)
            payload = r.json()
            payload.pop("submitted_at", None)
            sent.append((r.status_code, payload))
        answers.append(sent)
    assert answers[0] == answers[1]
    assert [status for status, _ in answers[0]] == [201, 201, 201]
    assert answers[0][0][1]["id"] != answers[0][1][1]["id"]
