"""The launch gate: launches wait while the state disk is full or read-only, or for a while
after a launch failed because of the machine.

While the gate is shut the core's cycle does not run, and each waiting job's reason says
why (best effort: a disk too full for the database may refuse the write, which is tried
again next cycle); once it opens they get their own reasons back and start."""

from __future__ import annotations

import logging
import time

from gpupool.domain.lifecycle import JobState
from gpupool.errors import IllegalTransition
from gpupool.scheduler import Scheduler
from gpupool.server.loop.diskspace import DiskFloor, DiskProbe, DiskSpace
from gpupool.server.loop.faults import describe
from gpupool.server.loop.state import LoopState
from gpupool.server.store import Store

log = logging.getLogger("gpupool.server")


class LaunchGate:
    """Shuts and opens `state.gate`; the launch backoff (1 s doubling to 30 s) after a
    launch that failed for the machine, so a full disk or a descriptor limit is not
    hammered every cycle."""

    LAUNCH_BACKOFF_MAX_S = 30.0

    def __init__(
        self,
        state: LoopState,
        floor: DiskFloor,
        disk: DiskProbe,
        scheduler: Scheduler,
        raw_store: Store,
    ) -> None:
        self.state = state
        self.floor = floor
        self.disk = disk
        self.scheduler = scheduler
        self.raw_store = raw_store
        """Without retries: the reasons it writes are best effort."""
        self.disk_space: DiskSpace | None = None
        """The state disk as last measured."""
        self.told: dict[int, str] = {}
        """Waiting jobs whose reason says why launches wait: job -> the reason they had."""
        self.told_kind: dict[int, str] = {}
        self.launch_backoff_s = 0.0
        self.launch_retry_at = -1e18
        self.launch_error: str | None = None

    def check(self, now: float) -> None:
        """Launches wait while the state disk is below its floor or read-only, or for a
        while after a launch failed for a reason of the machine (launch backoff); the
        waiting jobs' reasons say why, and they go back when the gate opens."""
        try:
            self.disk_space = self.disk.space()
            gate = self.floor.problem(self.disk_space)
        except OSError as err:
            gate = f"DiskUnknown: cannot measure the state directory's free space: {err}"
        if gate is None and time.monotonic() < self.launch_retry_at:
            gate = (
                f"LaunchFailing: {self.launch_error}; launches retry in "
                f"{self.launch_retry_at - time.monotonic():.0f} s"
            )
        was = self.state.gate
        if gate != was:
            if gate is not None and _kind(gate) != _kind(was):
                log.warning("launches wait: %s", gate)
                self._best_effort_event("launches-waiting", gate, now)
            elif gate is None:
                log.warning("launches resume")
                self._best_effort_event("launches-resumed", f"launches resume ({was})", now)
            self.state.gate = gate
        if self.state.gate is None:
            self._untell(now)
        else:
            self._tell(self.state.gate, now)

    def defer_reason(self, job_id: int, reason: str) -> bool:
        """Whether the job's reason says why launches wait now: then `reason` is the one
        it gets back once the gate opens (instead of being written now)."""
        if job_id not in self.told:
            return False
        self.told[job_id] = reason
        return True

    def launch_trouble(self, err: BaseException) -> None:
        """A launch failed for the machine, not the job: launches pause, 1 s doubling to
        30 s, so a full disk or a descriptor limit is not hammered every cycle."""
        self.launch_backoff_s = min(max(1.0, self.launch_backoff_s * 2), self.LAUNCH_BACKOFF_MAX_S)
        self.launch_retry_at = time.monotonic() + self.launch_backoff_s
        self.launch_error = describe(err)

    def launched(self) -> None:
        """A process started: the next failure of the machine backs off from 1 s again."""
        self.launch_backoff_s = 0.0

    def _best_effort_event(self, kind: str, message: str, now: float) -> None:
        try:
            self.raw_store.events.add(kind, message, now)
        except Exception as err:
            log.warning("could not record event %s: %s", kind, err)

    def _waiting_ids(self) -> list[int]:
        return [
            int(job_id)
            for job_id, r in self.scheduler.records.items()
            if r.state in (JobState.PENDING, JobState.SUSPENDED) and job_id.isdigit()
        ]

    def _tell(self, gate: str, now: float) -> None:
        """Waiting jobs' reasons say why (once per job; best effort: a full disk may
        refuse the write, which is tried again next cycle)."""
        kind = gate.split(":", 1)[0]
        for job_id in self._waiting_ids():
            if job_id in self.told and self.told_kind.get(job_id) == kind:
                continue
            try:
                row = self.raw_store.jobs.get(job_id)
                if row.state not in ("pending", "suspended"):
                    continue
                before = self.told.get(job_id, row.reason)
                self.raw_store.jobs.update(
                    job_id, now, expect=("pending", "suspended"), event="waiting", reason=gate
                )
            except Exception:
                continue
            self.told[job_id] = before
            self.told_kind[job_id] = kind

    def _untell(self, now: float) -> None:
        """Gate open: jobs still waiting get their reason back."""
        for job_id, before in list(self.told.items()):
            try:
                self.raw_store.jobs.update(
                    job_id, now, expect=("pending", "suspended"), reason=before
                )
            except IllegalTransition:
                pass  # it started or ended meanwhile: its reason says so already
            except Exception:
                continue  # the database refused: again next cycle
            del self.told[job_id]
            self.told_kind.pop(job_id, None)


def _kind(gate: str | None) -> str | None:
    """DiskFull, ReadOnly, LaunchFailing: the word a gate's reason starts with."""
    return None if gate is None else gate.split(":", 1)[0]
