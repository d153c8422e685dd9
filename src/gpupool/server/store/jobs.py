"""Jobs: submitting them (one at a time, grouped, or as one batch), reading them, and
moving them through their lifecycle with compare-and-set transitions; holds and purges.

A job's columns are its JobFields (gpupool.domain.job_fields) and what the scheduler
learns; the copies between JobRow, NewJob and the jobs table loop over those fields, with
small tables for the columns named otherwise and the values read back in other types."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, or_, select, text
from sqlalchemy import update as sql_update
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.domain.job_fields import JOB_FIELDS, as_json
from gpupool.domain.model import JobKind
from gpupool.errors import ConflictError, GpupoolError, IllegalTransition, SpecError
from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.checks import check_job, check_state, illegal_move, missing_job
from gpupool.server.store.events import insert_event
from gpupool.server.store.rows import JOB_ROW_FIELDS, JobRow, NewJob, Purged
from gpupool.server.store.states import SETTABLE, STATES, TERMINAL, TRANSITIONS
from gpupool.server.store.tables import EVENTS, JOBS, EventModel, JobModel

COLUMN_OF: dict[str, str] = {"owner": "owner_token", "user": "user_name"}
"""The JobFields stored under another column name."""


def _gpu_pairs(value: Any) -> tuple[tuple[str, int], ...]:
    return tuple((str(n), int(i)) for n, i in value)


_READ: dict[str, Callable[[Any], Any]] = {
    "gpus": _gpu_pairs,
    "resize_gpus": lambda v: None if v is None else _gpu_pairs(v),
    "dataset_gb": float,
    "state_gib_per_gpu": float,
    "gpu_milli": lambda v: 1000 if v is None else v,
    "cancel_requested": bool,
    "held": bool,
}
"""Columns read back in another type than the row's field (JSON lists, SQLite's 0 for
0.0, its integers for booleans, a NULL share of a row older than shares)."""
_WRITE: dict[str, Callable[[Any], Any]] = {
    "command": list,
    "env": dict,
    "sizing": lambda v: None if v is None else as_json(v),
    "dataset_gb": float,
    "state_gib_per_gpu": float,
}
"""JobFields written in another type than they hold."""
_ROW_COLUMNS = operator.attrgetter(*(COLUMN_OF.get(n, n) for n in JOB_ROW_FIELDS))
_FRESH: dict[str, Any] = {
    "retries": 0,
    "state": "pending",
    "reason": "",
    "node": None,
    "attempts": 0,
    "preemptions": 0,
    "exit_code": None,
    "pid": None,
    "pgid": None,
    "start_ticks": None,
    "started_at": None,
    "ended_at": None,
    "cancel_requested": False,
    "resize_gpus": None,
    "held": False,
    "port": None,
}
"""A newly submitted job's columns beyond its JobFields (and id, key and times)."""


def job_row(m: JobModel | SimpleNamespace) -> JobRow:
    """A job from its ORM object or from a plain row of the jobs table (`plain`)."""
    values = dict(zip(JOB_ROW_FIELDS, _ROW_COLUMNS(m), strict=True))
    for name, convert in _READ.items():
        values[name] = convert(values[name])
    return JobRow(**values)


def plain(r: Row[Any]) -> SimpleNamespace:
    """A row of the jobs table with its columns as attributes: where many jobs are read
    at once this skips the ORM's per-object work, and a namespace's attributes read
    faster than a Row's (3,000 jobs made into rows in ~47 ms instead of ~69)."""
    return SimpleNamespace(**r._mapping)


def job_values(job: NewJob, idempotency_key: str | None, now_s: float) -> dict[str, Any]:
    """The columns of a newly submitted job."""
    values: dict[str, Any] = {
        COLUMN_OF.get(name, name): _WRITE.get(name, _same)(getattr(job, name))
        for name in JOB_FIELDS
    }
    values.update(_FRESH, gpus=[], submitted_at=now_s, updated_at=now_s)
    values["idempotency_key"] = idempotency_key
    return values


def _same(value: Any) -> Any:
    return value


def _settable(fields: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - SETTABLE)
    if unknown:
        raise TypeError(f"cannot set {unknown}; settable columns: {sorted(SETTABLE)}")
    values = dict(fields)
    if "gpus" in values:
        values["gpus"] = [[node, index] for node, index in values["gpus"]]
    if values.get("resize_gpus") is not None:
        values["resize_gpus"] = [[node, index] for node, index in values["resize_gpus"]]
    return values


# Prepared once: a statement built per call costs more than the insert itself.
_INSERT_JOB = insert(JOBS).returning(JOBS.c.id, sort_by_parameter_order=True)
_NEXT_JOB_IDS = text(
    "SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, :n)"
)
"""PostgreSQL: n fresh job ids from the jobs table's own sequence."""
_SET_REASON = (
    sql_update(JOBS)
    .where(
        JOBS.c.id == bindparam("w_id"),
        or_(JOBS.c.state == "pending", JOBS.c.state == "suspended"),
    )
    .values(updated_at=bindparam("w_now_s"), reason=bindparam("w_reason"))
)
"""A waiting job's reason (executemany); the state guard stays as the row's last word."""
_IN_CHUNK = 500
"""Ids per IN (...) list: under SQLite's bound-parameter limit, whatever its build."""


@dataclass(frozen=True)
class Jobs(Repository):
    """Jobs and the events their submissions and moves write."""

    @transaction
    def submit(
        self, job: NewJob, now_s: float, idempotency_key: str | None = None
    ) -> tuple[JobRow, bool]:
        """Store a pending job and its 'submitted' event; (row, False) if the key was used."""
        return self._submit(job, now_s, idempotency_key)

    def _submit(
        self, job: NewJob, now_s: float, idempotency_key: str | None
    ) -> tuple[JobRow, bool]:
        """`submit` without its retry: submit_group's fallback for one item runs inside
        its own (retried) call."""
        check_job(job)
        try:
            with self.db.write() as s:
                if idempotency_key is not None:
                    found = s.scalars(
                        select(JobModel).where(JobModel.idempotency_key == idempotency_key)
                    ).one_or_none()
                    if found is not None:
                        return self._resubmitted(job_row(found), job), False
                row = self._insert_job(s, job, now_s, idempotency_key)
        except IntegrityError:
            # another submit with this key committed between our SELECT and INSERT
            if idempotency_key is None:
                raise
            with self.db.read() as s:
                found = s.scalars(
                    select(JobModel).where(JobModel.idempotency_key == idempotency_key)
                ).one_or_none()
                if found is None:
                    raise
                return self._resubmitted(job_row(found), job), False
        return row, True

    @transaction
    def submit_group(
        self, items: Sequence[tuple[NewJob, str | None]], now_s: float
    ) -> builtins.list[tuple[JobRow, bool] | GpupoolError]:
        """Many independent submissions in one transaction (group commit): the API
        gathers the requests that arrive while the previous commit runs. Each item gets
        what `submit` would have given it: (row, created), or its own error (a bad spec,
        a reused key) without failing the others. Durable when this returns."""
        out: builtins.list[tuple[JobRow, bool] | GpupoolError | None] = [None] * len(items)
        todo: builtins.list[int] = []
        for k, (job, _key) in enumerate(items):
            try:
                check_job(job)
                todo.append(k)
            except GpupoolError as err:
                out[k] = err
        try:
            with self.db.write() as s:
                keys = [items[k][1] for k in todo if items[k][1] is not None]
                existing: dict[str, JobRow] = {}
                if keys:
                    for m in s.scalars(select(JobModel).where(JobModel.idempotency_key.in_(keys))):
                        existing[str(m.idempotency_key)] = job_row(m)
                fresh: builtins.list[int] = []
                later: builtins.list[int] = []  # repeats of a key new in this group
                claimed: set[str] = set()
                for k in todo:
                    job, key = items[k]
                    if key is not None and key in existing:
                        try:
                            out[k] = (self._resubmitted(existing[key], job), False)
                        except ConflictError as err:
                            out[k] = err
                    elif key is not None and key in claimed:
                        later.append(k)
                    else:
                        fresh.append(k)
                        if key is not None:
                            claimed.add(key)
                rows = self._insert_jobs(s, [items[k] for k in fresh], now_s)
                for k, row in zip(fresh, rows, strict=True):
                    out[k] = (row, True)
                    if row.idempotency_key is not None:
                        existing[row.idempotency_key] = row
                for k in later:
                    job, key = items[k]
                    try:
                        out[k] = (self._resubmitted(existing[str(key)], job), False)
                    except ConflictError as err:
                        out[k] = err
        except IntegrityError:
            # a key committed by another process meanwhile: one by one, each on its own
            return [
                o if isinstance(o, GpupoolError) else self._submit_one(*items[k], now_s)
                for k, o in enumerate(out)
            ]
        return [o for o in out if o is not None]

    def _submit_one(
        self, job: NewJob, key: str | None, now_s: float
    ) -> tuple[JobRow, bool] | GpupoolError:
        try:
            return self._submit(job, now_s, key)
        except GpupoolError as err:
            return err

    @staticmethod
    def _resubmitted(row: JobRow, job: NewJob) -> JobRow:
        if row.spec() != job:
            raise ConflictError(
                f"idempotency key reused for a different job (job {row.id} was submitted "
                "with it); resubmit with a new key"
            )
        return row

    @transaction
    def submit_many(self, jobs: Sequence[NewJob], now_s: float) -> builtins.list[JobRow]:
        """Store a batch of pending jobs all together or not at all."""
        for job in jobs:
            check_job(job)
        with self.db.write() as s:
            return self._insert_jobs(s, [(job, None) for job in jobs], now_s)

    def _insert_job(
        self, s: Session, job: NewJob, now_s: float, idempotency_key: str | None
    ) -> JobRow:
        return self._insert_jobs(s, [(job, idempotency_key)], now_s)[0]

    def _insert_jobs(
        self, s: Session, items: Sequence[tuple[NewJob, str | None]], now_s: float
    ) -> builtins.list[JobRow]:
        """Insert pending jobs and their 'submitted' events: two multi-row statements."""
        if not items:
            return []
        rows = [job_values(job, key, now_s) for job, key in items]
        if self.db.dialect == "postgresql":
            # Ids from the sequence first, then one single-row INSERT run for every job
            # (executemany): psycopg converts that short statement once and pipelines
            # it, where the multi-row INSERT ... RETURNING that SQLAlchemy builds is
            # too long for psycopg's statement cache and was re-parsed on every commit
            # (a quarter of the server's CPU under a stream of submits).
            ids = sorted(int(i) for i in s.execute(_NEXT_JOB_IDS, {"n": len(rows)}).scalars())
            for values, job_id in zip(rows, ids, strict=True):
                values["id"] = job_id
            s.execute(insert(JOBS), rows)
        else:
            ids = [int(i) for i in s.execute(_INSERT_JOB, rows).scalars()]
        self._insert_submitted(s, ids, items, now_s)
        out = []
        for job_id, values in zip(ids, rows, strict=True):
            values["id"] = job_id
            out.append(job_row(SimpleNamespace(**values)))
        return out

    def _insert_submitted(
        self,
        s: Session,
        ids: Sequence[int],
        items: Sequence[tuple[NewJob, str | None]],
        now_s: float,
    ) -> None:
        """The 'submitted' events of freshly inserted jobs, last in their transaction."""
        self.db.lock_events(s)
        s.execute(
            insert(EVENTS),
            [
                {
                    "at_s": now_s,
                    "kind": "submitted",
                    "job_id": job_id,
                    "message": f"{job.name} ({job.kind}, {job.gpu_count} GPU) submitted for "
                    f"team {job.team}" + (f" by {job.owner}" if job.owner else ""),
                    "data": {"team": job.team, "kind": job.kind, "gpu_count": job.gpu_count},
                }
                for job_id, (job, _key) in zip(ids, items, strict=True)
            ],
        )

    @transaction
    def get(self, job_id: int) -> JobRow:
        with self.db.read() as s:
            found = s.get(JobModel, job_id)
            if found is None:
                raise missing_job(job_id)
            return job_row(found)

    @transaction
    def list(
        self,
        state: str | None = None,
        team: str | None = None,
        limit: int = 1000,
        after_id: int = 0,
        before_id: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[JobRow]:
        """Jobs in id order, a page at a time: pass the last id seen as after_id; newest
        first, pass the last id seen as before_id."""
        if limit < 1:
            raise SpecError(f"limit is {limit}; ask for at least 1 job")
        query = select(JOBS).where(JOBS.c.id > after_id)
        if before_id is not None:
            query = query.where(JOBS.c.id < before_id)
        if state is not None:
            check_state(state)
            query = query.where(JOBS.c.state == state)
        if team is not None:
            query = query.where(JOBS.c.team == team)
        order = JOBS.c.id.desc() if newest_first else JOBS.c.id
        with self.db.read() as s:
            return [job_row(plain(r)) for r in s.execute(query.order_by(order).limit(limit))]

    @transaction
    def active(self) -> builtins.list[JobRow]:
        """Every job the scheduler still has to look after, in id order."""
        query = select(JOBS).where(JOBS.c.state.not_in(TERMINAL)).order_by(JOBS.c.id)
        with self.db.read() as s:
            return [job_row(plain(r)) for r in s.execute(query)]

    @transaction
    def online_models(self) -> builtins.list[str | None]:
        """The GPU models online inference was ever submitted for (None: any model): the
        online reserve that holds once online work was seen outlives a restart."""
        query = select(JOBS.c.gpu_model).where(JOBS.c.kind == JobKind.ONLINE.value).distinct()
        with self.db.read() as s:
            return sorted((r[0] for r in s.execute(query)), key=lambda m: (m is not None, m or ""))

    @transaction
    def counts(self) -> dict[tuple[str, str, str], int]:
        """(team, kind, state) -> number of jobs, for the metrics endpoint."""
        query = select(JobModel.team, JobModel.kind, JobModel.state, func.count()).group_by(
            JobModel.team, JobModel.kind, JobModel.state
        )
        with self.db.read() as s:
            return {(t, k, st): int(n) for t, k, st, n in s.execute(query)}

    @transaction
    def transition(
        self,
        job_id: int,
        to_state: str,
        now_s: float,
        expect: str | tuple[str, ...] | None = None,
        event: str | None = None,
        **fields: Any,
    ) -> JobRow:
        """Move a job to to_state if it is in one of expect (default: any state allowed to).

        A compare-and-set: the UPDATE only matches while the row is still in an expected
        state, so two threads racing on one job cannot both win. Also sets updated_at, the
        given columns, ended_at on reaching a terminal state and started_at on first running
        (unless given), and writes an event (kind = event or to_state, message = reason) in the
        same transaction.
        """
        check_state(to_state)
        values = _settable(fields)
        if expect is None:
            expected = tuple(s for s in STATES if to_state in TRANSITIONS[s])
        else:
            expected = (expect,) if isinstance(expect, str) else tuple(expect)
            for old in expected:
                check_state(old)
                if to_state not in TRANSITIONS[old]:
                    raise illegal_move(job_id, old, to_state)
        with self.db.write() as s:
            current = s.execute(
                select(JobModel.state, JobModel.started_at)
                .where(JobModel.id == job_id)
                .with_for_update(key_share=True)
            ).one_or_none()
            if current is None:
                raise missing_job(job_id)
            old_state, started_at = current
            if old_state not in expected:
                if to_state not in TRANSITIONS[old_state]:
                    raise illegal_move(job_id, old_state, to_state)
                raise IllegalTransition(
                    f"job {job_id} is {old_state}, not {' or '.join(expected)}, so it was not "
                    f"moved to {to_state}; it changed meanwhile: read it again and decide anew"
                )
            if to_state in TERMINAL:
                values.setdefault("ended_at", now_s)
            if to_state == "running" and started_at is None:
                values.setdefault("started_at", now_s)
            updated = s.scalars(
                sql_update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_(expected))
                .values(state=to_state, updated_at=now_s, **values)
                .returning(JobModel),
                execution_options={"populate_existing": True},
            ).one_or_none()
            if updated is None:  # unreachable while the row lock holds; kept as the CAS guard
                raise IllegalTransition(f"job {job_id} changed while moving to {to_state}")
            reason = values.get("reason") or f"{old_state} -> {to_state}"
            data: dict[str, Any] = {"from": old_state, "to": to_state}
            if "gpus" in values:  # which cards each run held: the review's allocations
                data["gpus"] = values["gpus"]
            insert_event(self.db, s, event or to_state, reason, now_s, job_id, data)
            return job_row(updated)

    @transaction
    def update(
        self,
        job_id: int,
        now_s: float,
        expect: str | tuple[str, ...] | None = None,
        event: str | None = None,
        **fields: Any,
    ) -> JobRow:
        """Change columns without changing state (e.g. the pid once a process started).

        With expect, only while the job is in one of those states (IllegalTransition if not);
        an event is written only when event is given.
        """
        values = _settable(fields)
        expected = None if expect is None else ((expect,) if isinstance(expect, str) else expect)
        for wanted in expected or ():
            check_state(wanted)
        with self.db.write() as s:
            query = sql_update(JobModel).where(JobModel.id == job_id)
            if expected is not None:
                query = query.where(JobModel.state.in_(expected))
            updated = s.scalars(
                query.values(updated_at=now_s, **values).returning(JobModel),
                execution_options={"populate_existing": True},
            ).one_or_none()
            if updated is None:
                state = s.scalar(select(JobModel.state).where(JobModel.id == job_id))
                if state is None:
                    raise missing_job(job_id)
                raise IllegalTransition(
                    f"job {job_id} is {state}, not {' or '.join(expected or ())}; "
                    "it changed meanwhile: read it again and decide anew"
                )
            if event is not None:
                data = {"gpus": values["gpus"]} if "gpus" in values else None
                insert_event(self.db, s, event, str(values.get("reason", "")), now_s, job_id, data)
            return job_row(updated)

    @transaction
    def set_reasons(
        self, reasons: Sequence[tuple[int, str, str | None]], now_s: float
    ) -> dict[int, str | None]:
        """Many waiting jobs' reasons in one transaction: (job id, reason, event kind or
        None) each, written only while the job is pending or suspended, the events after
        every update (as `insert_event` needs). A cycle that tells thousands of new
        jobs why they wait costs one commit and a few statements, not one each: the
        loop calls this with every job submitted since its last cycle, and per-row ORM
        updates there took a third of the server's CPU under a stream of submissions.
        Returns the jobs left as they were, with the state each is in now (None: no such
        job)."""
        left: dict[int, str | None] = {}
        if not reasons:
            return left
        with self.db.write() as s:
            # Their states, read under the write lock (SQLite) or row locks (PostgreSQL,
            # taken in id order), so none changes between this read and the update.
            states: dict[int, str] = {}
            ids = sorted({job_id for job_id, _, _ in reasons})
            for k in range(0, len(ids), _IN_CHUNK):
                query = select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id.in_(ids[k : k + _IN_CHUNK]))
                if self.db.dialect == "postgresql":
                    query = query.order_by(JOBS.c.id).with_for_update()
                states.update((int(i), str(st)) for i, st in s.execute(query))
            changes: builtins.list[dict[str, Any]] = []
            events: builtins.list[dict[str, Any]] = []
            for job_id, reason, event_kind in reasons:
                state = states.get(job_id)
                if state not in ("pending", "suspended"):
                    left[job_id] = state
                    continue
                changes.append({"w_id": job_id, "w_reason": reason})
                if event_kind is not None:
                    events.append(
                        {
                            "at_s": now_s,
                            "kind": event_kind,
                            "job_id": job_id,
                            "message": reason,
                            "data": {},
                        }
                    )
            if changes:
                s.execute(_SET_REASON, [{**c, "w_now_s": now_s} for c in changes])
            if events:
                self.db.lock_events(s)
                s.execute(insert(EVENTS), events)
        return left

    def set_process(
        self, job_id: int, pid: int, pgid: int, start_ticks: int | None, now_s: float
    ) -> JobRow:
        """Record the process a job runs as, so a restarted scheduler can find (or kill) it."""
        return self.update(job_id, now_s, pid=pid, pgid=pgid, start_ticks=start_ticks)

    @transaction
    def request_cancel(self, job_id: int, now_s: float, reason: str = "cancelled") -> JobRow:
        """Ask for a job to stop: pending/suspended ones are cancelled at once, running ones
        get cancel_requested for the scheduler to act on; a finished job is returned as is."""
        with self.db.write() as s:
            job = s.scalars(
                select(JobModel).where(JobModel.id == job_id).with_for_update(key_share=True)
            ).one_or_none()
            if job is None:
                raise missing_job(job_id)
            if job.state in TERMINAL or job.cancel_requested:
                return job_row(job)  # asking twice, or too late, changes nothing
            old_state = job.state
            job.cancel_requested = True
            job.updated_at = now_s
            if old_state in ("pending", "suspended"):
                job.state = "cancelled"
                job.reason = reason
                job.ended_at = now_s
                kind, data = "cancelled", {"from": old_state, "to": "cancelled"}
            else:
                kind, data = "cancel-requested", {"state": old_state}
            s.flush()
            insert_event(self.db, s, kind, reason, now_s, job_id, data)
            return job_row(job)

    @transaction
    def set_held(self, job_id: int, held: bool, now_s: float, reason: str) -> JobRow:
        """Put a waiting job (or one being requeued) on hold, or release it; an event
        either way. Holding a running or ended job, holding twice or releasing a job that
        is not held is a ConflictError."""
        with self.db.write() as s:
            job = s.scalars(
                select(JobModel).where(JobModel.id == job_id).with_for_update(key_share=True)
            ).one_or_none()
            if job is None:
                raise missing_job(job_id)
            if held and job.state not in ("pending", "suspended", "preempting"):
                raise ConflictError(
                    f"job {job_id} is {job.state}; only a waiting (or requeued) job is held"
                )
            if bool(job.held) == held:
                raise ConflictError(
                    f"job {job_id} is {'on hold already' if held else 'not on hold'}"
                )
            job.held = held
            job.reason = reason
            job.updated_at = now_s
            s.flush()
            insert_event(self.db, s, "held" if held else "released", reason, now_s, job_id)
            return job_row(job)

    @transaction
    def run_started_at(self, job_id: int) -> float | None:
        """When the job's current run began: its last move to running."""
        query = (
            select(EventModel.at_s)
            .where(EventModel.job_id == job_id, EventModel.kind == "running")
            .order_by(EventModel.seq.desc())
            .limit(1)
        )
        with self.db.read() as s:
            at = s.scalar(query)
            return None if at is None else float(at)

    @transaction
    def purge(self, before_s: float, batch: int = 200) -> Purged:
        """Delete up to `batch` jobs that ended before `before_s` with their events, and
        up to `batch` job-less events from before then. Small batches keep each
        transaction short; call again while `Purged.more`."""
        if batch < 1:
            raise SpecError(f"batch is {batch}; purge at least 1 row at a time")
        with self.db.write() as s:
            ids = [
                int(i)
                for i in s.scalars(
                    select(JobModel.id)
                    .where(JobModel.state.in_(TERMINAL), JobModel.ended_at < before_s)
                    .order_by(JobModel.id)
                    .limit(batch)
                )
            ]
            events = 0
            if ids:
                gone = delete(EventModel).where(EventModel.job_id.in_(ids))
                events += len(s.scalars(gone.returning(EventModel.seq)).all())
                s.execute(delete(JobModel).where(JobModel.id.in_(ids)))
            old = select(EventModel.seq).where(
                EventModel.job_id.is_(None), EventModel.at_s < before_s
            )
            seqs = builtins.list(s.scalars(old.order_by(EventModel.seq).limit(batch)))
            more = len(ids) >= batch or len(seqs) >= batch
            if seqs:
                gone = delete(EventModel).where(EventModel.seq.in_(seqs))
                events += len(s.scalars(gone.returning(EventModel.seq)).all())
            return Purged(tuple(ids), events, more)
