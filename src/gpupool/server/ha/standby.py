"""A server that waits for the controller lease: it answers /healthz as the standby and
refuses the rest of the API (503, naming the active controller), then becomes the full
API the moment it takes the lease over.

Only one server schedules a database's queue (server/ha/lease.py). A standby has no
scheduler state to answer from, so it does not pretend: clients are sent to the active
one, and a load balancer can route on the role /healthz gives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.server.ha.lease import Lease

log = logging.getLogger("gpupool.server")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

POLL_S = 1.0
"""How often a standby tries to take the lease."""


def standby_app(lease: Lease, since_s: float) -> Starlette:
    def body() -> dict[str, Any]:
        return {
            "ok": True,
            "scheduler_error": None,
            "role": "standby",
            "problem": None,
            "standby_since": since_s,
            "lease": lease.where,
            "holder": lease.holder(),
        }

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse(body())

    async def refuse(_: Request) -> JSONResponse:
        return JSONResponse(
            {
                "detail": f"this gpupool server is the standby controller; the active one "
                f"({lease.holder()}) holds the lease on {lease.where}: send requests to it, "
                "or retry here once this server has taken over (its /healthz says role active)"
            },
            status_code=503,
            headers={"Retry-After": "1"},
        )

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/{path:path}", refuse, methods=methods),
        ]
    )


class Switch:
    """An ASGI app that hands every request to whichever app is current."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def wait_for_lease(
    lease: Lease,
    take_over: Callable[[], None],
    stopping: threading.Event,
    poll_s: float = POLL_S,
) -> threading.Thread:
    """A thread that polls the lease every `poll_s` and calls `take_over` once it holds it."""

    def run() -> None:
        while not stopping.is_set():
            try:
                got = lease.try_acquire()
            except Exception as err:  # the database is unreachable: keep standing by
                log.warning("standby: cannot try the controller lease: %s", err)
                got = False
            if got:
                log.warning("standby: took over the controller lease on %s", lease.where)
                started = time.monotonic()
                take_over()
                log.warning("standby: scheduling after %.1f s", time.monotonic() - started)
                return
            stopping.wait(poll_s)

    thread = threading.Thread(target=run, name="gpupool-standby", daemon=True)
    thread.start()
    return thread
