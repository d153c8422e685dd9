"""The service store on real SQLite and real PostgreSQL: durability, idempotency, the job
lifecycle as a compare-and-set, atomicity of every method, tokens and the event log.

Every store test runs twice: on a SQLite file under tmp_path and on a fresh database of a
throwaway PostgreSQL server (tests/support/pgserver.py).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gpupool.errors import ConflictError, IllegalTransition, NotFoundError, SpecError
from gpupool.server.store import JobRow, NewJob, Principal, Store, database_url, schema_head
from gpupool.server.store import jobs as jobs_module
from gpupool.server.store.events import insert_event
from gpupool.server.store.jobs import Jobs
from head_schema import at_head
from pgserver import fresh_schema, pg_url  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_700_000_000.0

# The lifecycle as the service promises it, written out independently of store.TRANSITIONS.
LEGAL = {  # the core's lifecycle (domain/lifecycle.py) in the store's words
    ("pending", "running"),
    ("pending", "cancelled"),
    ("pending", "failed"),
    ("running", "preempting"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "suspended"),
    ("preempting", "suspended"),
    ("preempting", "succeeded"),
    ("preempting", "failed"),
    ("preempting", "cancelled"),
    ("suspended", "running"),
    ("suspended", "cancelled"),
}
ALL_STATES = ("pending", "running", "preempting", "suspended", "succeeded", "failed", "cancelled")
PATH_TO = {
    "pending": (),
    "running": ("running",),
    "preempting": ("running", "preempting"),
    "suspended": ("running", "preempting", "suspended"),
    "succeeded": ("running", "succeeded"),
    "failed": ("failed",),
    "cancelled": ("cancelled",),
}


def job(name: str = "train-1", team: str = "vision", **kw: object) -> NewJob:
    fields: dict[str, object] = {
        "kind": "training",
        "priority": 5,
        "gpu_count": 2,
        "command": ("python", "train.py"),
    }
    fields.update(kw)
    return NewJob(name, team, **fields)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database_url(None, tmp_path / "state")
    return fresh_schema(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(url: str, open_store: Callable[[], Store]) -> Store:
    at_head(url)  # the migrations' schema without running them (tests/support/head_schema.py)
    s = open_store()
    s.migrate()
    return s


def n_events(store: Store) -> int:
    return len(store.events.after(0, limit=100_000))


def at_state(store: Store, state: str, name: str = "j") -> JobRow:
    row, _ = store.jobs.submit(job(name), T0)
    for i, step in enumerate(PATH_TO[state], start=1):
        row = store.jobs.transition(row.id, step, T0 + i)
    assert row.state == state
    return row


# ---- schema ---------------------------------------------------------------------------------
def test_migrate_twice_is_a_no_op_and_keeps_data(store: Store, url: str) -> None:
    row, _ = store.jobs.submit(job(), T0)
    store.migrate()
    Store(url).migrate()
    assert store.jobs.get(row.id) == row
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
            schema_head()
        ]
    engine.dispose()


def test_migration_creates_exactly_the_models(store: Store, url: str) -> None:
    """The hand-written revision and the ORM models must not drift apart."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from gpupool.server.store import Base

    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_sqlite_runs_wal_normal_with_foreign_keys(tmp_path: Path) -> None:
    with Store(database_url(None, tmp_path)) as store:
        store.migrate()
        with store.db.read() as s:
            assert s.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert s.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert s.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert s.execute(text("PRAGMA busy_timeout")).scalar() == 30_000


# ---- submit ---------------------------------------------------------------------------------
def test_submit_stores_the_spec_and_one_event(store: Store, url: str) -> None:
    spec = job(
        "résumé-7b",
        "nlp",
        kind="offline-inference",
        priority=-3,
        gpu_count=8,
        command=["torchrun", "--nproc", "8", "x.py"],
        env={"SEED": "1", "NOTE": "ünïcode"},
        cwd="/data/run",
        gpu_model="H200",
        checkpoint_every_s=600.0,
        grace_s=12.5,
        max_retries=3,
        duration_s=3600.25,
        owner="alice",
    )
    row, created = store.jobs.submit(spec, T0, idempotency_key="k-1")
    assert created
    assert row.spec() == spec
    assert (row.state, row.reason, row.retries, row.attempts, row.preemptions) == (
        "pending",
        "",
        0,
        0,
        0,
    )
    assert (row.gpus, row.node, row.pid, row.exit_code, row.cancel_requested) == (
        (),
        None,
        None,
        None,
        False,
    )
    assert (row.submitted_at, row.updated_at, row.started_at, row.ended_at) == (T0, T0, None, None)
    assert (row.idempotency_key, row.owner) == ("k-1", "alice")
    again = Store(url)  # a second process's view: the row was committed before submit returned
    try:
        assert again.jobs.get(row.id) == row
        [ev] = again.events.after(0)
        assert (ev.kind, ev.job_id, ev.at_s) == ("submitted", row.id, T0)
    finally:
        again.close()


def test_submit_survives_sigkill_right_after_it_returns(store: Store, url: str) -> None:
    """What the API promises: once submit returned, not even SIGKILL can lose the job."""
    child = (
        "import os, signal, sys\n"
        "from gpupool.server.store import NewJob, Store\n"
        "s = Store(sys.argv[1])\n"
        "row, _ = s.jobs.submit(NewJob('k', 't', 'batch', 0, 1, ('true',)), 1.0)\n"
        "print(row.id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == -9, done.stderr
    row = store.jobs.get(int(done.stdout))
    assert (row.name, row.state) == ("k", "pending")
    assert [e.kind for e in store.events.after(0)] == ["submitted"]


def test_submit_refuses_a_bad_spec_and_writes_nothing(store: Store) -> None:
    for bad in (
        job(kind="gaming"),
        job(gpu_count=-1),
        job(command=()),
        job(env={"SEED": 1}),
        job(team=""),
    ):
        with pytest.raises(SpecError):
            store.jobs.submit(bad, T0)
    assert store.jobs.list() == []
    assert n_events(store) == 0


def test_same_key_returns_the_same_job(store: Store) -> None:
    first, created = store.jobs.submit(job(), T0, idempotency_key="abc")
    second, created_again = store.jobs.submit(job(), T0 + 5, idempotency_key="abc")
    assert created and not created_again
    assert second == first
    other, _ = store.jobs.submit(job(), T0, idempotency_key="abd")
    assert other.id != first.id
    assert len(store.jobs.list()) == 2
    assert n_events(store) == 2


def test_key_reused_for_a_different_job_conflicts(store: Store) -> None:
    store.jobs.submit(job(), T0, idempotency_key="abc")
    for changed in (job(gpu_count=4), job(env={"A": "1"}), job(owner="mallory")):
        with pytest.raises(ConflictError, match="idempotency key reused for a different job"):
            store.jobs.submit(changed, T0, idempotency_key="abc")
    assert len(store.jobs.list()) == 1


def test_racing_submits_with_one_key_make_one_row(store: Store) -> None:
    barrier = threading.Barrier(8)

    def go(_: int) -> tuple[JobRow, bool]:
        barrier.wait()
        return store.jobs.submit(job(), T0, idempotency_key="race")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(go, range(8)))
    assert len({row.id for row, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(store.jobs.list()) == 1
    assert n_events(store) == 1


def test_submit_many_is_one_transaction(store: Store) -> None:
    rows = store.jobs.submit_many([job(f"j{i}") for i in range(5)], T0)
    assert [r.name for r in rows] == [f"j{i}" for i in range(5)]
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert store.jobs.list() == rows
    with pytest.raises(SpecError):
        store.jobs.submit_many([job("ok"), job("bad", kind="nope")], T0)
    assert store.jobs.list() == rows
    assert n_events(store) == 5


def _crash_on_event(store: Store, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
    """Make the store die inside its transaction, after its other statements already ran
    (the jobs' rows are inserted; their events are the transaction's last statement)."""
    calls = {"n": 0}
    for owner, name in ((Jobs, "_insert_submitted"), (jobs_module, "insert_event")):
        real = getattr(owner, name)

        def dying(*args: object, _real: Any = real, **kw: object) -> Any:
            calls["n"] += 1
            if calls["n"] > after:
                raise RuntimeError("simulated crash mid-transaction")
            return _real(*args, **kw)

        monkeypatch.setattr(owner, name, dying)


def test_a_crash_mid_submit_leaves_nothing(
    store: Store, open_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    _crash_on_event(store, monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        store.jobs.submit(job(), T0, idempotency_key="k")
    monkeypatch.undo()
    _crash_on_event(store, monkeypatch)  # both jobs' rows are written, then the crash
    with pytest.raises(RuntimeError, match="simulated crash"):
        store.jobs.submit_many([job("a"), job("b")], T0)
    monkeypatch.undo()
    fresh = open_store()
    assert fresh.jobs.list() == []
    assert n_events(fresh) == 0
    _, created = fresh.jobs.submit(job(), T0, idempotency_key="k")  # the key was never taken
    assert created


def test_a_failing_field_value_mid_transition_leaves_nothing(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    with pytest.raises(Exception, match=r"(?i)range|overflow|too large"):
        store.jobs.transition(row.id, "running", T0 + 1, node="n1", pid=2**80)
    assert store.jobs.get(row.id) == row
    assert n_events(store) == 1


def test_a_crash_after_the_update_leaves_the_old_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    row, _ = store.jobs.submit(job(), T0)
    _crash_on_event(store, monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        store.jobs.transition(row.id, "running", T0 + 1, gpus=[("n1", 0)], pid=42)
    monkeypatch.undo()
    assert store.jobs.get(row.id) == row
    assert n_events(store) == 1


# ---- the lifecycle --------------------------------------------------------------------------
def test_transition_table(store: Store) -> None:
    for old in ALL_STATES:
        for new in ALL_STATES:
            row = at_state(store, old, f"{old}->{new}")
            events = n_events(store)
            if (old, new) in LEGAL:
                moved = store.jobs.transition(row.id, new, T0 + 10)
                assert moved.state == new
                assert n_events(store) == events + 1
            else:
                with pytest.raises(IllegalTransition, match=f"from {old} to {new}"):
                    store.jobs.transition(row.id, new, T0 + 10)
                assert store.jobs.get(row.id) == row
                assert n_events(store) == events


def test_transition_sets_columns_and_writes_its_event(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    running = store.jobs.transition(
        row.id,
        "running",
        T0 + 1,
        expect="pending",
        event="started",
        gpus=[("n1", 0), ("n1", 3)],
        node="n1",
        pid=4242,
        pgid=4242,
        start_ticks=987_654_321_000,
        attempts=1,
        reason="placed on n1",
    )
    assert running.gpus == (("n1", 0), ("n1", 3))
    assert (running.node, running.pid, running.pgid, running.start_ticks) == (
        "n1",
        4242,
        4242,
        987_654_321_000,
    )
    assert (running.attempts, running.started_at, running.updated_at) == (1, T0 + 1, T0 + 1)
    assert running == store.jobs.get(row.id)
    ev = store.events.after(0)[-1]
    assert (ev.kind, ev.job_id, ev.message, ev.at_s) == ("started", row.id, "placed on n1", T0 + 1)
    # the run's cards go in its event too: the review's allocations, run by run
    assert ev.data == {"from": "pending", "to": "running", "gpus": [["n1", 0], ["n1", 3]]}
    done = store.jobs.transition(row.id, "succeeded", T0 + 9, exit_code=0)
    assert (done.state, done.exit_code, done.ended_at, done.started_at) == (
        "succeeded",
        0,
        T0 + 9,
        T0 + 1,
    )
    assert done.terminal
    assert store.events.after(0)[-1].kind == "succeeded"


def test_transition_is_a_compare_and_set(store: Store) -> None:
    row = at_state(store, "running")
    events = n_events(store)
    with pytest.raises(IllegalTransition, match="is running, not pending"):
        store.jobs.transition(row.id, "failed", T0 + 5, expect="pending")
    with pytest.raises(IllegalTransition, match="from succeeded to running"):
        store.jobs.transition(row.id, "running", T0 + 5, expect="succeeded")  # never legal
    assert store.jobs.get(row.id) == row
    assert n_events(store) == events
    moved = store.jobs.transition(row.id, "failed", T0 + 5, expect=("pending", "running"))
    assert moved.state == "failed"


def test_racing_transitions_have_one_winner(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    barrier = threading.Barrier(8)

    def go(i: int) -> str:
        barrier.wait()
        try:
            store.jobs.transition(row.id, "running", T0 + 1, expect="pending", node=f"n{i}")
        except IllegalTransition:
            return "lost"
        return f"n{i}"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(go, range(8)))
    winners = [r for r in results if r != "lost"]
    assert len(winners) == 1
    assert store.jobs.get(row.id).node == winners[0]
    assert [e.kind for e in store.events.after(0)] == ["submitted", "running"]


def test_transition_refuses_unknowns(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    with pytest.raises(NotFoundError, match="job 999999 does not exist; gpupool ls"):
        store.jobs.transition(999_999, "running", T0)
    with pytest.raises(SpecError, match="unknown job state"):
        store.jobs.transition(row.id, "finished", T0)
    with pytest.raises(TypeError, match="cannot set"):
        store.jobs.transition(row.id, "running", T0, name="renamed")
    with pytest.raises(NotFoundError):
        store.jobs.get(999_999)
    assert store.jobs.get(row.id) == row


def test_update_and_set_process_keep_the_state(store: Store) -> None:
    row = at_state(store, "running")
    events = n_events(store)
    updated = store.jobs.set_process(row.id, 11, 10, 123, T0 + 7)
    assert (updated.state, updated.pid, updated.pgid, updated.start_ticks) == (
        "running",
        11,
        10,
        123,
    )
    assert updated.updated_at == T0 + 7
    assert n_events(store) == events
    with pytest.raises(IllegalTransition, match="is running, not suspended"):
        store.jobs.update(row.id, T0 + 8, expect="suspended", reason="x")
    store.jobs.update(row.id, T0 + 8, expect="running", event="note", reason="hot GPU")
    assert store.jobs.get(row.id).reason == "hot GPU"
    assert store.events.after(0)[-1].kind == "note"
    with pytest.raises(NotFoundError):
        store.jobs.update(999_999, T0)


def test_set_reasons_writes_only_waiting_jobs_and_their_events(store: Store) -> None:
    """Pending and suspended jobs take their reason (an event where one is asked for);
    a job in any other state, or none at all, is left and reported with its state. More
    jobs than one IN (...) list holds, so the chunked read is exercised."""
    waiting = store.jobs.submit_many([job(f"w{i}") for i in range(620)], T0)
    suspended = at_state(store, "suspended", "s")
    running = at_state(store, "running", "r")
    events = n_events(store)
    told = [
        (r.id, f"Queued: behind {i}", "wait-reason" if i % 2 else None)
        for i, r in enumerate(waiting)
    ]
    told += [
        (suspended.id, "Preempted: waiting for GPUs", "wait-reason"),
        (running.id, "Queued: never", "wait-reason"),
        (999_999, "Queued: gone", None),
    ]
    left = store.jobs.set_reasons(told, T0 + 20)
    assert left == {running.id: "running", 999_999: None}
    for i, r in enumerate(waiting):
        row = store.jobs.get(r.id)
        assert (row.state, row.reason, row.updated_at) == (
            "pending",
            f"Queued: behind {i}",
            T0 + 20,
        )
    assert store.jobs.get(suspended.id).reason == "Preempted: waiting for GPUs"
    assert store.jobs.get(running.id).reason != "Queued: never"
    new = store.events.after(0, limit=100_000)[events:]
    assert [(e.kind, e.job_id, e.message, e.at_s) for e in new] == [
        ("wait-reason", r.id, f"Queued: behind {i}", T0 + 20)
        for i, r in enumerate(waiting)
        if i % 2
    ] + [("wait-reason", suspended.id, "Preempted: waiting for GPUs", T0 + 20)]
    assert store.jobs.set_reasons([], T0 + 21) == {}


def test_request_cancel(store: Store) -> None:
    pending, _ = store.jobs.submit(job("p"), T0)
    cancelled = store.jobs.request_cancel(pending.id, T0 + 1)
    assert (cancelled.state, cancelled.cancel_requested, cancelled.ended_at) == (
        "cancelled",
        True,
        T0 + 1,
    )
    suspended = at_state(store, "suspended", "s")
    assert store.jobs.request_cancel(suspended.id, T0 + 2).state == "cancelled"

    running = at_state(store, "running", "r")
    events = n_events(store)
    asked = store.jobs.request_cancel(running.id, T0 + 3)
    assert (asked.state, asked.cancel_requested) == ("running", True)
    assert store.events.after(0)[-1].kind == "cancel-requested"
    assert store.jobs.request_cancel(running.id, T0 + 4) == asked  # asking twice changes nothing
    assert n_events(store) == events + 1
    finished = store.jobs.transition(running.id, "cancelled", T0 + 5, expect="running")
    assert store.jobs.request_cancel(running.id, T0 + 6) == finished
    with pytest.raises(NotFoundError):
        store.jobs.request_cancel(999_999, T0)


# ---- queries --------------------------------------------------------------------------------
def test_list_filters_orders_and_pages(store: Store) -> None:
    a = store.jobs.submit(job("a", "vision"), T0)[0]
    b = store.jobs.submit(job("b", "nlp"), T0)[0]
    c = store.jobs.submit(job("c", "vision"), T0)[0]
    d = store.jobs.submit(job("d", "nlp", kind="batch"), T0)[0]
    store.jobs.transition(b.id, "running", T0 + 1)
    store.jobs.transition(c.id, "cancelled", T0 + 1)
    assert [r.name for r in store.jobs.list()] == ["a", "b", "c", "d"]
    assert [r.name for r in store.jobs.list(team="vision")] == ["a", "c"]
    assert [r.name for r in store.jobs.list(state="pending")] == ["a", "d"]
    assert [r.name for r in store.jobs.list(state="running", team="nlp")] == ["b"]
    assert store.jobs.list(state="running", team="vision") == []
    assert [r.name for r in store.jobs.list(limit=2)] == ["a", "b"]
    assert [r.name for r in store.jobs.list(limit=2, after_id=b.id)] == ["c", "d"]
    assert [r.name for r in store.jobs.active()] == ["a", "b", "d"]
    assert store.jobs.counts() == {
        ("vision", "training", "pending"): 1,
        ("vision", "training", "cancelled"): 1,
        ("nlp", "training", "running"): 1,
        ("nlp", "batch", "pending"): 1,
    }
    with pytest.raises(SpecError, match="unknown job state"):
        store.jobs.list(state="done")
    assert a.id < b.id < c.id < d.id


def test_events_log_pages_in_order(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    seq = store.events.add("node-unhealthy", "n1 lost", T0 + 1, data={"node": "n1"})
    seq2 = store.events.add("note", "for the job", T0 + 2, job_id=row.id)
    assert seq2 > seq
    events = store.events.after(0)
    assert [e.kind for e in events] == ["submitted", "node-unhealthy", "note"]
    assert events[1].data == {"node": "n1"} and events[1].job_id is None
    assert [e.seq for e in store.events.after(events[0].seq, limit=1)] == [seq]
    assert [e.kind for e in store.events.after(0, job_id=row.id)] == ["submitted", "note"]
    with pytest.raises(NotFoundError):
        store.events.add("note", "nobody", T0, job_id=999_999)
    assert n_events(store) == 3


def test_an_event_writer_waits_for_an_open_write(store: Store) -> None:
    """Seqs commit in order (a poller of events_after never skips one); reads never wait."""
    row, _ = store.jobs.submit(job(), T0)
    finished = threading.Event()
    seqs: list[int] = []
    with store.db.write() as s:
        held = insert_event(store.db, s, "held", "open transaction", T0)
        worker = threading.Thread(
            target=lambda: (seqs.append(store.events.add("late", "", T0)), finished.set())
        )
        worker.start()
        assert not finished.wait(0.3)
        assert store.jobs.get(row.id) == row  # a reader is not blocked by the open write
    worker.join(10)
    assert finished.is_set()
    assert seqs[0] > held


# ---- tokens ---------------------------------------------------------------------------------
def test_tokens(store: Store, url: str) -> None:
    assert not store.auth.has_admin()
    team_token = store.auth.create_token("alice", "vision", T0)
    assert not store.auth.has_admin()
    admin_token = store.auth.create_token("root", None, T0)
    assert store.auth.has_admin()
    assert team_token.startswith("gp_") and len(team_token) > 40
    assert team_token != admin_token
    alice = store.auth.principal(team_token)
    assert alice == Principal("alice", "vision") and not alice.is_admin
    root = store.auth.principal(admin_token)
    assert root == Principal("root", None) and root.is_admin
    assert store.auth.principal("gp_not-a-token") is None
    assert store.auth.principal("") is None

    engine = create_engine(url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT name, team, hash FROM tokens ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in stored] == [
        ("alice", "vision", hashlib.sha256(team_token.encode()).hexdigest()),
        ("root", None, hashlib.sha256(admin_token.encode()).hexdigest()),
    ]
    assert not any(team_token in str(r) or admin_token in str(r) for r in stored)
    assert not any(team_token in e.message for e in store.events.after(0))

    with pytest.raises(ConflictError, match="alice"):
        store.auth.create_token("alice", "nlp", T0)
    store.auth.revoke_token("alice", T0 + 1)
    assert store.auth.principal(team_token) is None
    with pytest.raises(NotFoundError):
        store.auth.revoke_token("alice", T0 + 2)


# ---- URLs (no database needed) --------------------------------------------------------------
def test_database_url() -> None:
    state = Path("/var/lib/gpupool")
    assert database_url(None, state) == "sqlite:////var/lib/gpupool/gpupool.db"
    assert database_url("sqlite:////tmp/x.db", state) == "sqlite:////tmp/x.db"
    assert (
        database_url("postgresql://u:p@db:5432/gp", state) == "postgresql+psycopg://u:p@db:5432/gp"
    )
    assert database_url("postgresql+psycopg://u@db/gp", state) == "postgresql+psycopg://u@db/gp"
    for bad in ("mysql://u@db/gp", "gpupool.db", "sqlite:///:memory:", ""):
        with pytest.raises(SpecError, match="postgresql://"):
            database_url(bad, state)


# ---- the contract, kept by every repository -----------------------------------------------
def test_every_public_repository_method_is_one_transaction() -> None:
    """A public method is marked @transaction (one transaction, retried whole on the loop's
    store) or only hands over to one that is; a marked one calls no other marked one, so
    no call is retried twice over (base.py)."""
    import ast
    import inspect

    from gpupool.server.store import auth, events, history, jobs, nodes, services, settings

    for module in (auth, events, history, jobs, nodes, services, settings):
        tree = ast.parse(inspect.getsource(module))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
            marked = {
                m.name
                for m in methods
                if any(isinstance(d, ast.Name) and d.id == "transaction" for d in m.decorator_list)
            }
            for m in methods:
                calls = {
                    c.func.attr
                    for c in ast.walk(m)
                    if isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Attribute)
                    and isinstance(c.func.value, ast.Name)
                    and c.func.value.id == "self"
                }
                where = f"{module.__name__}.{cls.name}.{m.name}"
                if m.name in marked:
                    assert not calls & marked, f"{where} calls {calls & marked}"
                elif not m.name.startswith("_"):
                    assert calls & marked, f"{where} is neither marked nor hands over"
