"""The event log: what happened to jobs, services, nodes and tokens, in commit order
(a poller of `after(seq)` never skips one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.checks import missing_job
from gpupool.server.store.db import Database
from gpupool.server.store.rows import EventRow
from gpupool.server.store.tables import EVENTS, EventModel

_INSERT_EVENT = insert(EVENTS).returning(EVENTS.c.seq)
"""Prepared once: a statement built per call costs more than the insert itself."""


def insert_event(
    db: Database,
    session: Session,
    kind: str,
    message: str,
    now_s: float,
    job_id: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> int:
    """Insert an event as the last thing a transaction does (the PostgreSQL lock needs
    it: Database.lock_events); returns its seq."""
    db.lock_events(session)
    seq = session.execute(
        _INSERT_EVENT,
        {
            "at_s": now_s,
            "kind": kind,
            "job_id": job_id,
            "message": message,
            "data": dict(data or {}),
        },
    ).scalar_one()
    return int(seq)


def event_row(m: EventModel) -> EventRow:
    return EventRow(m.seq, m.at_s, m.kind, m.job_id, m.message, dict(m.data))


@dataclass(frozen=True)
class Events(Repository):
    """Appending to the event log and reading it back."""

    @transaction
    def add(
        self,
        kind: str,
        message: str,
        now_s: float,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> int:
        """Append to the event log; returns the new event's seq."""
        try:
            with self.db.write() as s:
                return insert_event(self.db, s, kind, message, now_s, job_id, data)
        except IntegrityError as exc:
            if job_id is not None:
                raise missing_job(job_id) from exc
            raise

    @transaction
    def after(self, seq: int, limit: int = 500, job_id: int | None = None) -> list[EventRow]:
        """Events with a seq above `seq`, oldest first: poll with the last seq seen.

        Seqs are committed in increasing order, so a poller never skips one.
        """
        query = select(EventModel).where(EventModel.seq > seq)
        if job_id is not None:
            query = query.where(EventModel.job_id == job_id)
        with self.db.read() as s:
            return [event_row(m) for m in s.scalars(query.order_by(EventModel.seq).limit(limit))]

    @transaction
    def count(self, job_id: int, kind: str, prefix: str = "") -> int:
        """How many events of `kind` (with a message starting with `prefix`) a job has had."""
        query = select(func.count()).where(EventModel.job_id == job_id, EventModel.kind == kind)
        if prefix:
            query = query.where(EventModel.message.startswith(prefix, autoescape=True))
        with self.db.read() as s:
            return int(s.scalar(query) or 0)
