"""How the loop reports an error it survives: logged, kept for /healthz, an event.

Each stage of a step, each job's exit, each command and each launch is guarded on its own
(`Faults.report`), so that an error costs that stage or that job one cycle and never the
loop. The functions below say what an error means: its text for a job's reason, and
whether a launch failed because of the machine rather than the job."""

from __future__ import annotations

import contextlib
import errno
import logging
import time

from gpupool.errors import GpupoolError
from gpupool.ports.clock.base import Clock
from gpupool.server.loop.health import LoopHealth
from gpupool.server.loop.state import LoopState
from gpupool.server.store import Store, transient

log = logging.getLogger("gpupool.server")

ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EMFILE,
        errno.ENFILE,
        errno.EIO,
        errno.ENOMEM,
        errno.EAGAIN,
        errno.EACCES,
        errno.EPERM,
    }
)
"""OS errors that say the server's machine is in trouble (disk, descriptors, memory), not
the job: a launch that fails with one is requeued, and launches pause for a while."""


class Faults:
    """The loop's errors: each logged with its stage and job (a repeat once a minute),
    kept in `LoopHealth` and the state's `loop_error`, and recorded as an event where
    the database takes one."""

    REPEAT_LOG_S = 60.0

    def __init__(self, state: LoopState, health: LoopHealth, raw_store: Store, clock: Clock):
        self.state = state
        self.health = health
        self.raw_store = raw_store
        """The store without retries: the database may be what failed."""
        self.clock = clock
        self.reported: dict[tuple[str, int | None, str], float] = {}
        """When each distinct loop error was last logged (repeats are logged once a minute)."""

    def report(self, stage: str, err: BaseException, job_id: int | None = None) -> None:
        """An unexpected error: logged with its stage and job, shown by /healthz and
        /v1/cluster, and an event where the database takes one; the loop goes on."""
        what = describe(err)
        where = f"{stage}" + (f" (job {job_id})" if job_id is not None else "")
        self.health.error(stage, what, job_id)
        self.state.loop_error = f"{where}: {what}"
        # The same error every cycle is logged (and recorded) once a minute, not 20 times
        # a second: a fault that lasts a day must not fill the disk with its own log.
        key, now_mono = (stage, job_id, what), time.monotonic()
        if now_mono - self.reported.get(key, -1e18) < self.REPEAT_LOG_S:
            return
        if len(self.reported) > 1000:
            self.reported.clear()
        self.reported[key] = now_mono
        log.error("scheduler %s failed: %s", where, what, exc_info=err)
        with contextlib.suppress(Exception):  # the database may be what failed; logged
            self.raw_store.events.add(
                "loop-error", f"{stage}: {what}"[:2000], self.clock.now(), job_id=job_id
            )

    def db_retry(self, err: BaseException, attempt: int, delay_s: float) -> None:
        """A database call of the loop failed and is retried (its store's Retry)."""
        stage = self.state.stage
        message = f"database unavailable, retry {attempt} in {delay_s:g} s: {describe(err)}"
        if attempt == 1 or attempt % 10 == 0:
            log.warning("scheduler %s: %s", stage, message)
        self.health.error(stage, message[:2000])
        self.state.loop_error = f"{stage}: {message}"


def describe(err: BaseException) -> str:
    """An error for a job's reason: our own messages as they are, others with their type
    (a database error as the driver said it, without SQLAlchemy's statement and links)."""
    if isinstance(err, GpupoolError):
        return str(err)
    orig = getattr(err, "orig", None)
    if isinstance(orig, BaseException):
        return f"{type(orig).__name__}: {orig}"
    return f"{type(err).__name__}: {err}"


def environmental(err: BaseException) -> bool:
    """Whether a launch failed because of the machine (disk full or read-only, out of file
    descriptors or memory, the database unavailable), not because of the job."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in ENVIRONMENT_ERRNOS:
            return True
        if transient(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def job_number(job_id: object) -> int | None:
    """The database id of a core's job id (None for one that is not a number)."""
    return int(job_id) if isinstance(job_id, str) and job_id.isdigit() else None
