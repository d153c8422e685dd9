"""The dashboard's page and the read endpoints its panels use, in-process: TestClient on
create_app with auth on, a real SQLite store, a fake executor and fleet (2 x A100-80GB,
2 x H100) and a manual clock; the scheduler acts only when a test steps it.

/ and its two files need no token and forbid any other origin (Content-Security-Policy);
/v1/me says who a token is (and, without one, that a token is needed); /v1/teams gives each
team's GPUs held against its guarantee and maximum now (the active window's or its own);
/v1/jobs/{id}/events is one job's history.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.api.routes.dashboard import DASHBOARD_ASSETS
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.main import load_service_config
from gpupool.server.store import Store, database_url
from head_schema import at_head

CONFIG = """\
teams:
  - {name: alpha, guaranteed: {A100-80GB: 1}, max: {A100-80GB: 2}}
  - {name: beta, max: {A100-80GB: 1, H100: 1}}
windows:
  - {from: "06:00", to: "18:00", teams: {alpha: {guaranteed: 0.5, max: 1.0}}}
online_reserve: 0
"""
NOON = 86_400.0 * 100 + 12 * 3600.0
"""A scheduler time inside the day window."""


@dataclass
class Dash:
    client: TestClient
    service: LiveService
    clock: ManualClock
    admin: dict[str, str]
    alpha: dict[str, str]
    beta: dict[str, str]

    def step(self, n: int = 2) -> None:
        for _ in range(n):
            self.clock.advance(1.0)
            self.service.step()

    def submit(self, team: str, gpus: int = 1, **extra: object) -> int:
        body = {"command": ["train"], "team": team, "gpus": gpus, **extra}
        r = self.client.post("/v1/jobs", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


@pytest.fixture()
def dash(tmp_path: Path) -> Iterator[Dash]:
    (tmp_path / "service.yaml").write_text(CONFIG, encoding="utf-8")
    scheduling = load_service_config(tmp_path / "service.yaml", LIVE_DEFAULTS)
    store = Store(at_head(database_url(None, tmp_path / "db")))
    store.migrate()
    clock = ManualClock(NOON)
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "state", scheduling=scheduling, sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB,2xH100"),
        clock,
    )
    app = create_app(service, store, auth=True)

    def bearer(name: str, team: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {store.auth.create_token(name, team, 0.0)}"}

    with TestClient(app) as client:
        yield Dash(
            client, service, clock, bearer("root", None), bearer("a", "alpha"), bearer("b", "beta")
        )
    store.close()


def test_the_page_needs_no_token_and_loads_nothing_from_elsewhere(dash: Dash) -> None:
    page = dash.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    for name in ("dashboard.js", "dashboard.css"):
        assert f'"/dashboard/{name}"' in page.text
        asset = dash.client.get(f"/dashboard/{name}")
        assert asset.status_code == 200, name
        assert asset.headers["content-type"] == DASHBOARD_ASSETS[name]
    # every URL the files name is this server's own
    for name in DASHBOARD_ASSETS:
        text = dash.client.get("/" if name == "index.html" else f"/dashboard/{name}").text
        assert "http://" not in text and "https://" not in text and "//" + "cdn" not in text
    assert dash.client.get("/dashboard/../api.py").status_code == 404
    assert dash.client.get("/dashboard/app.js").status_code == 404
    # the data itself needs the token
    assert dash.client.get("/v1/cluster").status_code == 401


def test_me_says_who_and_whether_a_token_is_needed(dash: Dash) -> None:
    anonymous = dash.client.get("/v1/me")
    assert anonymous.status_code == 200
    assert anonymous.json() == {
        "auth": True,
        "signed_in": False,
        "name": None,
        "role": None,
        "team": None,
    }
    me = dash.client.get("/v1/me", headers=dash.alpha).json()
    assert me == {"auth": True, "signed_in": True, "name": "a", "role": "team", "team": "alpha"}
    assert dash.client.get("/v1/me", headers=dash.admin).json()["role"] == "admin"
    bad = dash.client.get("/v1/me", headers={"authorization": "Bearer gp_nope"})
    assert bad.status_code == 401 and "unknown token" in bad.json()["detail"]


def test_me_with_auth_off_needs_no_sign_in(tmp_path: Path) -> None:
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "state", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("1xA100-80GB"),
        ManualClock(NOON),
    )
    with TestClient(create_app(service, store, auth=False)) as client:
        me = client.get("/v1/me").json()
        assert me == {
            "auth": False,
            "signed_in": True,
            "name": "anonymous",
            "role": "admin",
            "team": None,
        }
        assert client.get("/v1/teams").json()["teams"] == []
    store.close()


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80))
def test_me_with_any_authorization_header_is_a_200_or_a_401(dash: Dash, value: str) -> None:
    """/v1/me is outside the schemathesis run (its only input is the token, which that run
    fixes): any header text is answered, never a server error."""
    r = dash.client.get("/v1/me", headers={"authorization": value})
    assert r.status_code in (200, 401), (value, r.status_code, r.text)
    if r.status_code == 200:
        assert r.json()["signed_in"] is False or r.json()["name"] in ("root", "a", "b")


def _pool(body: dict[str, object], team: str, pool: str) -> dict[str, object]:
    for t in body["teams"]:  # type: ignore[attr-defined]
        if t["team"] == team:
            for p in t["pools"]:
                if p["pool"] == pool:
                    return dict(p)
    raise AssertionError(f"no {team}/{pool} in {body}")


def test_teams_against_their_quotas_and_the_active_window(dash: Dash) -> None:
    a1 = dash.submit("alpha", gpu_model="A100-80GB")
    dash.submit("beta", gpu_model="A100-80GB")
    waits = dash.submit("beta", gpu_model="A100-80GB")  # beta's max of A100s is 1
    dash.submit("gamma", gpu_model="H100")  # a team the configuration does not name
    dash.step()
    assert dash.client.get(f"/v1/jobs/{a1}", headers=dash.admin).json()["state"] == "running"
    waiting = dash.client.get(f"/v1/jobs/{waits}", headers=dash.admin).json()
    assert waiting["state"] == "pending" and waiting["reason_code"] == "QuotaMax", waiting

    body = dash.client.get("/v1/teams", headers=dash.beta).json()  # any token reads it
    assert [t["team"] for t in body["teams"]] == ["alpha", "beta", "gamma"]
    assert body["window"] == {
        "start": "06:00",
        "end": "18:00",
        "guaranteed_share": {"alpha": 0.5},
        "max_share": {"alpha": 1.0},
    }
    assert body["windows"] == [body["window"]]
    # alpha by the window: half of the 2 A100s guaranteed, all of them at most
    assert _pool(body, "alpha", "A100-80GB") == {
        "pool": "A100-80GB",
        "gpu_model": "A100-80GB",
        "pool_gpus": 2,
        "used_gpus": 1,
        "guaranteed_gpus": 1,
        "max_gpus": 2,
        "quota_guaranteed_gpus": 1,
        "quota_max_gpus": 2,
    }
    beta = _pool(body, "beta", "A100-80GB")
    assert (beta["used_gpus"], beta["guaranteed_gpus"], beta["max_gpus"]) == (1, 0, 1)
    beta_team = next(t for t in body["teams"] if t["team"] == "beta")
    assert (beta_team["running_jobs"], beta_team["waiting_jobs"]) == (1, 1)
    gamma = next(t for t in body["teams"] if t["team"] == "gamma")
    assert gamma["configured"] is False
    assert _pool(body, "gamma", "H100")["used_gpus"] == 1
    only = dash.client.get("/v1/teams", params={"team": "beta"}, headers=dash.admin).json()
    assert [t["team"] for t in only["teams"]] == ["beta"]

    # at night the window is over: alpha's own quota holds again
    dash.clock.advance(9 * 3600.0)
    dash.service.step()
    night = dash.client.get("/v1/teams", headers=dash.admin).json()
    assert night["window"] is None and len(night["windows"]) == 1
    alpha = _pool(night, "alpha", "A100-80GB")
    assert (alpha["guaranteed_gpus"], alpha["max_gpus"]) == (1, 2)


def test_a_jobs_history_and_who_reads_its_logs(dash: Dash) -> None:
    job = dash.submit("beta")
    dash.step()
    events = dash.client.get(f"/v1/jobs/{job}/events", headers=dash.alpha).json()
    kinds = [e["kind"] for e in events["events"]]
    assert kinds[:2] == ["submitted", "running"], kinds
    assert events["job_id"] == job and events["next"] == events["events"][-1]["seq"]
    later = dash.client.get(
        f"/v1/jobs/{job}/events", params={"after": events["next"]}, headers=dash.admin
    ).json()
    assert later["events"] == [] and later["next"] == events["next"]
    missing = dash.client.get("/v1/jobs/999/events", headers=dash.admin)
    assert missing.status_code == 404 and "999" in missing.json()["detail"]
    # the logs stay the job's team's (and an admin's): the sentence the dashboard shows
    refused = dash.client.get(f"/v1/jobs/{job}/logs", headers=dash.alpha)
    assert refused.status_code == 403
    assert refused.json()["detail"] == f"job {job} belongs to team beta, not alpha"
    assert dash.client.get(f"/v1/jobs/{job}/logs", headers=dash.beta).status_code == 200


def test_the_new_read_endpoints_are_in_the_schema(dash: Dash) -> None:
    schema = dash.client.get("/openapi.json", headers=dash.admin).json()
    for path in ("/v1/me", "/v1/teams", "/v1/jobs/{job_id}/events"):
        assert "get" in schema["paths"][path], path
    assert "/" not in schema["paths"] and "/dashboard/{name}" not in schema["paths"]
