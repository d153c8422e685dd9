"""Credentials through the real API and store: roles, expiry, revocation at once, the audit
trail, what needs a token, newest-first paging; and the 0004 migration of a database that
is at 0003. Every test runs on SQLite and on PostgreSQL (tests/support/pgserver.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager as contextlib_contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from api_harness import Api, bearer
from gpupool.errors import ConflictError, NotFoundError, SpecError
from gpupool.server.api.app import create_app
from gpupool.server.security.auth import AuditTrail, TokenCache
from gpupool.server.store import MIGRATIONS_DIR, AuditEntry, NewJob, Principal, Store, schema_head
from pgserver import pg_url  # noqa: F401

WALL0 = 1_800_000_000.0


class Wall:
    """The clock tokens expire by, moved by hand."""

    def __init__(self) -> None:
        self.now = WALL0

    def __call__(self) -> float:
        return self.now


@dataclass
class Secured:
    api: Api
    client: TestClient
    wall: Wall
    admin: dict[str, str]

    def token(self, name: str, **body: Any) -> dict[str, str]:
        r = self.client.post("/v1/tokens", json={"name": name, **body}, headers=self.admin)
        assert r.status_code == 201, r.text
        return bearer(r.json()["token"])

    def audit(self, **params: Any) -> list[dict[str, Any]]:
        r = self.client.get("/v1/audit", params=params, headers=self.admin)
        assert r.status_code == 200, r.text
        rows: list[dict[str, Any]] = r.json()["audit"]
        return rows


@pytest.fixture
def secure(make_api: Callable[..., Api]) -> Iterator[Callable[..., Secured]]:
    clients: list[TestClient] = []

    def make(**options: Any) -> Secured:
        base = make_api(auth=False)  # its own app is not used: ours has auth and a hand clock
        wall = Wall()
        app = create_app(base.service, base.store, auth=True, wall=wall, **options)
        client = TestClient(app, raise_server_exceptions=False)
        clients.append(client)
        name = "root" if len(clients) == 1 else f"root-{len(clients)}"  # one database
        admin = bearer(base.store.auth.create_token(name, None, wall.now))
        return Secured(base, client, wall, admin)

    yield make
    for c in clients:
        c.close()


def submit(s: Secured, headers: dict[str, str], team: str = "nlp") -> Any:
    return s.client.post("/v1/jobs", json={"command": ["train"], "team": team}, headers=headers)


# ---- expiry and revocation ------------------------------------------------------------------
def test_an_expired_token_is_refused_at_once(secure: Callable[..., Secured]) -> None:
    s = secure()
    nlp = s.token("ci-nlp", team="nlp", expires_in_s=60)
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 200  # now in the cache
    s.wall.now += 59.9
    assert submit(s, nlp).status_code == 201
    s.wall.now += 0.2
    r = s.client.get("/v1/jobs", headers=nlp)
    assert r.status_code == 401
    assert "ci-nlp expired" in r.json()["detail"]
    # and from the database too (a fresh server, an empty cache)
    assert s.api.store.auth.principal(nlp["Authorization"][7:], s.wall.now) is None
    listed = {t["name"]: t for t in s.client.get("/v1/tokens", headers=s.admin).json()["tokens"]}
    assert listed["ci-nlp"]["state"] == "expired"
    assert listed["ci-nlp"]["expires_at"] == pytest.approx(WALL0 + 60)


def test_a_revoked_token_is_refused_on_its_next_request(secure: Callable[..., Secured]) -> None:
    s = secure()
    nlp = s.token("ci-nlp", team="nlp")
    for _ in range(3):  # cached by now
        assert s.client.get("/v1/jobs", headers=nlp).status_code == 200
    r = s.client.post("/v1/tokens/ci-nlp/revoke", headers=s.admin)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "revoked" and r.json()["revoked_at"] == s.wall.now
    r = s.client.get("/v1/jobs", headers=nlp)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert submit(s, nlp).status_code == 401
    assert s.api.n_jobs() == 0
    # revoking twice finds nothing; the name is free again, for a new secret
    assert s.client.post("/v1/tokens/ci-nlp/revoke", headers=s.admin).status_code == 404
    again = s.token("ci-nlp", team="nlp")
    assert s.client.get("/v1/jobs", headers=again).status_code == 200
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 401


def test_revoke_by_id_and_the_last_admin_stays(secure: Callable[..., Secured]) -> None:
    s = secure()
    made = s.client.post("/v1/tokens", json={"name": "ops", "role": "admin"}, headers=s.admin)
    ops = bearer(made.json()["token"])
    assert made.json()["role"] == "admin" and made.json()["team"] is None
    r = s.client.post(f"/v1/tokens/{made.json()['id']}/revoke", headers=s.admin)
    assert r.status_code == 200 and r.json()["name"] == "ops"
    assert s.client.get("/v1/jobs", headers=ops).status_code == 401
    r = s.client.post("/v1/tokens/root/revoke", headers=s.admin)
    assert r.status_code == 409 and "last active admin" in r.json()["detail"]
    assert s.client.get("/v1/jobs", headers=s.admin).status_code == 200


def test_a_revoke_by_another_process_is_seen_within_the_cache_ttl(
    secure: Callable[..., Secured],
) -> None:
    """The database is the truth: a revoke this server did not make ends the cached
    principal after TokenCache.ttl_s."""
    s = secure()
    ticks = [0.0]
    s.client.app.state.tokens = TokenCache(ttl_s=5.0, monotonic=lambda: ticks[0])  # type: ignore[attr-defined]
    nlp = s.token("ci-nlp", team="nlp")
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 200
    Store(s.api.url).auth.revoke_token("ci-nlp", s.wall.now)  # as another server would
    ticks[0] = 4.9
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 200  # still cached
    ticks[0] = 5.1
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 401


# ---- roles ----------------------------------------------------------------------------------
def test_a_read_only_token_sees_and_changes_nothing(secure: Callable[..., Secured]) -> None:
    s = secure()
    job = submit(s, s.admin).json()
    s.api.step()
    (s.api.service.config.run_dir(job["id"]) / "stdout.log").write_bytes(b"secret\n")
    ro = s.token("grafana", role="read-only")
    assert [j["id"] for j in s.client.get("/v1/jobs", headers=ro).json()["jobs"]] == [job["id"]]
    assert s.client.get(f"/v1/jobs/{job['id']}", headers=ro).status_code == 200
    assert s.client.get("/v1/cluster", headers=ro).status_code == 200
    assert s.client.get("/v1/events", headers=ro).status_code == 200
    assert s.client.get("/metrics", headers=ro).status_code == 200
    for r in (
        submit(s, ro),
        s.client.post("/v1/jobs/batch", json={"jobs": [{"command": ["a"]}]}, headers=ro),
        s.client.post(f"/v1/jobs/{job['id']}/cancel", headers=ro),
        s.client.post("/v1/tokens", json={"name": "x", "role": "admin"}, headers=ro),
    ):
        assert r.status_code == 403, r.text
        assert "read-only" in r.json()["detail"]
    assert s.client.get(f"/v1/jobs/{job['id']}/logs", headers=ro).status_code == 403
    assert s.client.get("/v1/audit", headers=ro).status_code == 403
    assert s.client.get("/v1/tokens", headers=ro).status_code == 403
    assert s.api.n_jobs() == 1 and s.api.job(job["id"])["state"] == "running"


def test_a_team_token_cannot_act_for_another_team(secure: Callable[..., Secured]) -> None:
    s = secure()
    nlp = s.token("nlp-bot", team="nlp")
    cv_job = submit(s, s.admin, team="cv").json()
    assert submit(s, nlp, team="cv").status_code == 403
    assert s.client.post(f"/v1/jobs/{cv_job['id']}/cancel", headers=nlp).status_code == 403
    assert s.client.post("/v1/tokens/root/revoke", headers=nlp).status_code == 403
    assert s.client.get("/v1/audit", headers=nlp).status_code == 403


def test_token_requests_are_checked(secure: Callable[..., Secured]) -> None:
    s = secure()
    for body in (
        {"name": "a", "role": "team"},  # a team token needs its team
        {"name": "b", "role": "read-only", "team": "nlp"},
        {"name": "c", "team": "nlp", "expires_in_s": 0},
        {"name": "d", "role": "root"},
    ):
        r = s.client.post("/v1/tokens", json=body, headers=s.admin)
        assert r.status_code == 422, (body, r.text)
    listed = s.client.get("/v1/tokens", headers=s.admin).json()["tokens"]
    assert [t["name"] for t in listed] == ["root"]
    assert set(listed[0]) == {
        "id",
        "name",
        "role",
        "team",
        "state",
        "created_at",
        "expires_at",
        "revoked_at",
        "created_by",
    }  # never the token, never its hash


# ---- the audit trail ------------------------------------------------------------------------
def test_admin_actions_and_token_use_are_audited(secure: Callable[..., Secured]) -> None:
    s = secure()
    nlp = s.token("nlp-bot", team="nlp", expires_in_s=3600)
    job = submit(s, nlp).json()
    assert submit(s, nlp, team="cv").status_code == 403
    assert s.client.get("/v1/jobs", headers=nlp).status_code == 200  # a read: not audited
    assert s.client.get("/v1/jobs", headers=bearer("gp_guess")).status_code == 401
    assert s.client.post(f"/v1/jobs/{job['id']}/cancel", headers=s.admin).status_code == 200
    assert s.client.post("/v1/tokens/nlp-bot/revoke", headers=s.admin).status_code == 200
    rows = s.audit()
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    seen = [
        (r["action"], r["token"], r["role"], r["team"], r["method"], r["path"], r["status"])
        for r in reversed(rows)
    ]
    assert (
        seen
        == [
            ("token-created", None, None, None, "", "", None),  # root, made by the store
            ("token-created", "root", "admin", None, "", "", None),
            ("request", "root", "admin", None, "POST", "/v1/tokens", 201),
            ("request", "nlp-bot", "team", "nlp", "POST", "/v1/jobs", 201),
            ("request", "nlp-bot", "team", "nlp", "POST", "/v1/jobs", 403),
            ("request", None, None, None, "GET", "/v1/jobs", 401),
            ("request", "root", "admin", None, "POST", f"/v1/jobs/{job['id']}/cancel", 200),
            ("token-revoked", "root", "admin", None, "", "", None),
            ("request", "root", "admin", None, "POST", "/v1/tokens/nlp-bot/revoke", 200),
            ("request", "root", "admin", None, "GET", "/v1/audit", 200),
        ][: len(seen)]
    )
    assert len(seen) == 9  # this read of the trail is written after it was read
    created = rows[-2]
    assert "nlp-bot" in created["detail"] and "team nlp" in created["detail"]
    assert all(r["at_s"] == s.wall.now for r in rows)
    assert rows[0]["client"]  # from where: the peer address
    # the next read shows the previous one; paging and filtering
    again = s.audit(limit=1)
    assert [(r["method"], r["path"]) for r in again] == [("GET", "/v1/audit")]
    older = s.audit(before=again[-1]["id"], token="nlp-bot")
    assert {r["token"] for r in older} == {"nlp-bot"} and len(older) == 2


def test_the_audit_trail_is_purged_by_age_and_capped(api: Api) -> None:
    store = api.store
    store.auth.add_audit([AuditEntry(float(t), "request", "x", method="POST") for t in range(100)])
    trail = AuditTrail(store, keep_days=1.0, keep_rows=30, wall=lambda: 86_400.0 + 50)
    assert trail.purge() == 70  # 50 older than a day, then all but the newest 30
    rows = store.auth.audit(limit=1000)
    assert len(rows) == 30 and [r.entry.at_s for r in rows] == [float(t) for t in range(99, 69, -1)]
    trail.record(AuditEntry(86_400.0 + 50, "request", "y"))
    assert trail.flush(10)
    assert store.auth.audit(limit=1)[0].entry.token == "y"


# ---- what needs a token ---------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/metrics", "/docs", "/redoc", "/openapi.json"])
def test_metrics_and_docs_need_a_token_unless_open(
    secure: Callable[..., Secured], path: str
) -> None:
    closed = secure()
    assert closed.client.get(path).status_code == 401
    assert closed.client.get(path, headers=bearer("gp_guess")).status_code == 401
    assert closed.client.get(path, headers=closed.admin).status_code == 200
    opened = secure(open_metrics=True, open_docs=True)
    assert opened.client.get(path).status_code == 200
    only_metrics = secure(open_metrics=True)
    assert only_metrics.client.get(path).status_code == (200 if path == "/metrics" else 401)


def test_the_schema_still_lists_every_operation(secure: Callable[..., Secured]) -> None:
    s = secure()
    paths = s.client.get("/openapi.json", headers=s.admin).json()["paths"]
    assert {"/v1/tokens", "/v1/tokens/{ref}/revoke", "/v1/audit", "/metrics"} <= set(paths)
    assert "/docs" not in paths


# ---- paging ---------------------------------------------------------------------------------
def test_jobs_page_newest_first_with_before(api: Api) -> None:
    rows = api.store.jobs.submit_many(
        [NewJob(f"j{i}", "nlp", "batch", 50, 0, ("true",)) for i in range(7)], 1.0
    )
    ids = [r.id for r in rows]
    seen: list[int] = []
    before: int | None = None
    for _ in range(10):
        params: dict[str, Any] = {"order": "desc", "limit": 3}
        if before is not None:
            params["before"] = before
        page = [j["id"] for j in api.client.get("/v1/jobs", params=params).json()["jobs"]]
        seen += page
        if len(page) < 3:
            break
        before = page[-1]
    assert seen == ids[::-1]
    # the old callers' order and paging are unchanged
    assert [
        j["id"] for j in api.client.get("/v1/jobs", params={"after": ids[4]}).json()["jobs"]
    ] == ids[5:]


def test_running_pages_with_preempting_jobs_miss_none(api: Api) -> None:
    for _ in range(4):
        api.submitted(gpus=0)
    api.step()
    running = [r.id for r in api.store.jobs.list(state="running")]
    assert len(running) == 4
    api.store.jobs.transition(running[1], "preempting", 2_000.0)
    got: list[int] = []
    after = 0
    for _ in range(10):
        page = api.client.get("/v1/jobs", params={"state": "running", "limit": 1, "after": after})
        ids = [j["id"] for j in page.json()["jobs"]]
        assert len(ids) <= 1
        if not ids:
            break
        got += ids
        after = ids[-1]
    assert got == running


# ---- the store and the migration ------------------------------------------------------------
def test_store_token_roles_and_expiry(api: Api) -> None:
    store = api.store
    ro = store.auth.create_token("watch", None, WALL0, role="read-only", expires_at=WALL0 + 10)
    who = store.auth.principal(ro, WALL0 + 9)
    assert who == Principal("watch", None, "read-only", WALL0 + 10)
    assert who is not None and who.read_only and not who.is_admin
    assert store.auth.principal(ro, WALL0 + 10) is None
    with pytest.raises(SpecError, match="future"):
        store.auth.create_token("late", "nlp", WALL0, expires_at=WALL0)
    with pytest.raises(SpecError, match="team"):
        store.auth.create_token("x", "nlp", WALL0, role="admin")
    assert not store.auth.has_admin(WALL0)
    store.auth.create_token("boss", None, WALL0, expires_at=WALL0 + 5)
    assert store.auth.has_admin(WALL0 + 4) and not store.auth.has_admin(WALL0 + 5)
    with pytest.raises(ConflictError):
        store.auth.create_token("watch", "nlp", WALL0 + 1)  # active: its name is taken
    store.auth.create_token("watch", "nlp", WALL0 + 11)  # expired: the name is free
    with pytest.raises(NotFoundError):
        store.auth.revoke_token("nobody", WALL0)


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    return config


def test_a_0003_database_upgrades_in_place(empty_url: str) -> None:
    url = empty_url
    Store(url).close()  # makes a SQLite file's directory
    engine = create_engine(url)
    with engine.begin() as conn:
        config = _config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0003")
        conn.execute(
            text(
                "INSERT INTO tokens (name, team, hash, created_at) VALUES "
                "('old-admin', NULL, :a, 1.0), ('old-team', 'nlp', :t, 2.0)"
            ),
            {"a": "a" * 64, "t": "b" * 64},
        )
    engine.dispose()
    with Store(url) as store:
        store.migrate()
        by_name = {t.name: t for t in store.auth.tokens()}
        assert by_name["old-admin"].role == "admin" and by_name["old-team"].role == "team"
        assert all(t.state(WALL0) == "active" for t in by_name.values())
        assert store.auth.has_admin(WALL0)
        store.auth.revoke_token("old-team", WALL0)
        assert store.auth.audit(limit=5)[0].entry.action == "token-revoked"
    engine = create_engine(url)
    with engine.connect() as conn:
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    engine.dispose()
    assert version == schema_head()


def test_the_serve_bootstrap_admin_survives_a_team_token_named_admin(
    tmp_path: Path,
) -> None:
    from gpupool.server.main import bootstrap_admin
    from gpupool.server.store import database_url

    with Store(database_url(None, tmp_path)) as store:
        store.migrate()
        store.auth.create_token("admin", "nlp", WALL0)
        token = bootstrap_admin(store)
        who = store.auth.principal(token)
        assert who is not None and who.is_admin and who.name.startswith("admin-")


# ---- the audit trail yields to the scheduler's writes -----------------------------------------
def _sqlite_holder(path: Path) -> Iterator[Any]:
    """Another process's write lock on a SQLite database, as a second connection holds it."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_an_audit_write_gives_up_soon_on_a_locked_database(tmp_path: Path) -> None:
    import threading

    from sqlalchemy.exc import OperationalError

    db_path = tmp_path / "audit.db"
    with Store(f"sqlite:///{db_path}") as store:
        store.migrate()
        failed: list[BaseException] = []

        def write() -> None:
            try:
                store.auth.add_audit([AuditEntry(1.0, "request", "x")])
            except BaseException as err:
                failed.append(err)

        holder = contextlib_contextmanager(_sqlite_holder)(db_path)
        with holder:
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            # A scheduler write would wait SQLITE_BUSY_TIMEOUT_S (30 s) here.
            writer.join(15)
            assert not writer.is_alive(), "the audit write waited on the lock as long as any"
        assert len(failed) == 1 and isinstance(failed[0], OperationalError), failed
        # The connection it used waits the full timeout again for the next ordinary write.
        store.auth.add_audit([AuditEntry(2.0, "request", "y")])
        with store.db.write() as s:
            busy = s.execute(text("PRAGMA busy_timeout")).scalar()
        assert busy == 30_000


def test_the_audit_trail_keeps_entries_while_the_database_is_locked(tmp_path: Path) -> None:
    db_path = tmp_path / "audit.db"
    with Store(f"sqlite:///{db_path}") as store:
        store.migrate()
        trail = AuditTrail(store, wall=lambda: 1e9, retry_first_s=0.2, retry_max_s=0.5)
        holder = contextlib_contextmanager(_sqlite_holder)(db_path)
        with holder:
            for t in range(5):
                trail.record(AuditEntry(1e9 + t, "request", f"t{t}"))
            assert not trail.flush(3), "nothing can be written while the lock is held"
        assert trail.flush(30)
        assert trail.dropped == 0
        rows = store.auth.audit(limit=100)
        assert [r.entry.token for r in rows] == [f"t{t}" for t in range(4, -1, -1)]


def test_the_audit_trail_drops_the_oldest_beyond_its_queue_bound(tmp_path: Path) -> None:
    db_path = tmp_path / "audit.db"
    with Store(f"sqlite:///{db_path}") as store:
        store.migrate()
        trail = AuditTrail(
            store, wall=lambda: 1e9, max_queued=3, retry_first_s=0.2, retry_max_s=0.5
        )
        holder = contextlib_contextmanager(_sqlite_holder)(db_path)
        with holder:
            for t in range(6):
                trail.record(AuditEntry(1e9 + t, "request", f"t{t}"))
            assert not trail.flush(3)
        assert trail.flush(30)
        assert trail.dropped == 3
        assert [r.entry.token for r in store.auth.audit(limit=100)] == ["t5", "t4", "t3"]
