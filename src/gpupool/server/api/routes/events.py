"""The event stream: every event after a sequence number, long-polled (GET /v1/events).
One job's events are the dashboard's (routes/dashboard.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from gpupool.server.api.deps import Db, Who
from gpupool.server.api.schemas import MAX_ID

router = APIRouter()


@router.get("/v1/events", summary="Events after a sequence number (long poll)")
async def events(
    who: Who,
    store: Db,
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    wait: Annotated[float, Query(ge=0, le=30)] = 0.0,
) -> dict[str, Any]:
    deadline = time.monotonic() + wait
    while True:
        rows = await run_in_threadpool(store.events.after, after, 500)
        if rows or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    return {
        "events": [
            {
                "seq": e.seq,
                "at_s": e.at_s,
                "kind": e.kind,
                "job_id": e.job_id,
                "message": e.message,
            }
            for e in rows
        ],
        "next": rows[-1].seq if rows else after,
    }
