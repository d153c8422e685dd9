"""A fake executor: no processes, jobs run until a test ends or stops them, on the clock
the caller passes. It keeps the contract of `base.Executor` as LocalExecutor does (same
errors, same outcomes through `classify`), so the loop's tests need no machine."""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.errors import ConflictError, NotFoundError, SpecError
from gpupool.ports.executor.base import (
    DEFAULT_GRACE_S,
    MULTI_NODE_REFUSED,
    Executor,
    Exit,
    Gang,
    Handle,
    LaunchSpec,
    classify,
    validate,
)
from gpupool.ports.executor.stops import ask_stop, watched


@dataclass
class _FakeProc:
    handle: Handle
    watched: bool = True
    dead: bool = False  # adopted but not running: report "lost" on next poll
    stop_kind: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    exit_at_s: float | None = None  # when it leaves by itself after SIGTERM
    deadline_s: float | None = None  # when it is killed, if still there
    kill_sent: bool = False
    ended: tuple[int | None, int | None] | None = None  # (exit_code, signal)
    vanished: bool = False


class FakeExecutor:
    """No processes: jobs run until finish() or a stop, on the clock the caller passes.

    `exit_after_s`: how long a stopped job takes to checkpoint and leave (0: at once).
    Jobs in `ignores_sigterm` (or slower than their grace period) are killed at the
    deadline. A stopped job's Exit comes from the first poll at or after its exit or kill
    time; LocalExecutor reports a kill one poll later, once the process is gone. Every
    call is logged in `calls` as (verb, job_id); shutdown logs ("shutdown", "").
    `runs_gangs`: take jobs across nodes as RayExecutor does (one fake process stands for
    the whole gang; `gangs` keeps each launch's members), else refuse them as LocalExecutor
    does."""

    def __init__(
        self,
        exit_after_s: float = 0.0,
        ignores_sigterm: Iterable[str] = (),
        runs_gangs: bool = False,
        addresses: Mapping[str, str] | None = None,
    ) -> None:
        self.runs_gangs = runs_gangs
        self.addresses = dict(addresses or {})
        """Each node's address (`node_address`); a node not named here has 127.0.0.1."""
        self.gangs: list[tuple[str, Gang]] = []
        self.exit_after_s = exit_after_s
        self.ignores_sigterm: set[str] = set(ignores_sigterm)
        self.calls: list[tuple[str, str]] = []
        self._procs: dict[str, _FakeProc] = {}
        self._next_pid = 100_000

    def node_address(self, node: str) -> str:
        return self.addresses.get(node, "127.0.0.1")

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        validate(spec)
        if spec.job_id in self._procs and self._procs[spec.job_id].watched:
            raise ConflictError(
                f"job {spec.job_id} is already watched here (attempt "
                f"{self._procs[spec.job_id].handle.attempt}); poll until it ends before "
                "launching it again"
            )
        if spec.gang is not None and len(spec.gang.members) > 1:
            if not self.runs_gangs:
                raise SpecError(f"job {spec.job_id}: {MULTI_NODE_REFUSED}")
            self.gangs.append((spec.job_id, spec.gang))
        self.calls.append(("launch", spec.job_id))
        self._next_pid += 1
        handle = Handle(spec.job_id, spec.attempt, self._next_pid, self._next_pid, int(now_s))
        self._procs[spec.job_id] = _FakeProc(handle)
        return handle

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        self.calls.append(("preempt", job_id))
        self._stop(job_id, "preempt", grace_s, now_s)

    can_resize = True

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        self.preempt(job_id, grace_s, now_s)

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        self.calls.append(("cancel", job_id))
        self._stop(job_id, "cancel", grace_s, now_s)

    def _stop(self, job_id: str, kind: str, grace_s: float, now_s: float) -> None:
        proc = watched(self._procs, job_id)
        if not proc.watched:
            raise NotFoundError(f"job {job_id} is not watched: adopt it first")
        if proc.dead or proc.ended is not None or proc.vanished:
            return
        ask_stop(proc, kind, grace_s, now_s)
        if job_id not in self.ignores_sigterm and proc.exit_at_s is None:
            proc.exit_at_s = now_s + self.exit_after_s

    def finish(self, job_id: str, exit_code: int = 0, signal_num: int | None = None) -> None:
        """The job ends by itself (or dies of `signal_num`); the next poll reports it."""
        proc = watched(self._procs, job_id)
        if proc.ended is None:
            proc.ended = (None, signal_num) if signal_num is not None else (exit_code, None)

    def vanish(self, job_id: str) -> None:
        """The process disappears without a record, as in a reboot: outcome "lost"."""
        watched(self._procs, job_id).vanished = True

    def poll(self, now_s: float) -> list[Exit]:
        exits: list[Exit] = []
        for job_id, proc in list(self._procs.items()):
            if not proc.watched:
                continue
            if proc.ended is None and not proc.vanished and not proc.dead:
                exit_at_s, kill_at_s = proc.exit_at_s, proc.deadline_s
                leaves = exit_at_s is not None and exit_at_s <= now_s
                if leaves and (kill_at_s is None or (exit_at_s or 0.0) < kill_at_s):
                    proc.ended = (0, None)
                elif kill_at_s is not None and kill_at_s <= now_s:
                    proc.kill_sent = True
                    proc.ended = (None, signal.SIGKILL)
                else:
                    continue
            code, sig = proc.ended if proc.ended is not None else (None, None)
            exits.append(
                classify(
                    job_id,
                    proc.handle.attempt,
                    exit_code=code,
                    signal_num=sig,
                    at_s=now_s,
                    stop_kind=proc.stop_kind,
                    kill_sent=proc.kill_sent,
                    grace_s=proc.grace_s,
                    vanished=proc.ended is None,
                )
            )
            del self._procs[job_id]
        return exits

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """True if this fake still "runs" exactly that attempt (left by shutdown()); else
        False and the next poll reports it, "lost" when nothing ended it."""
        self.calls.append(("adopt", handle.job_id))
        proc = self._procs.get(handle.job_id)
        if proc is not None and proc.watched:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
        if proc is not None and proc.handle == handle:
            proc.watched = True
            return proc.ended is None and not proc.vanished
        self._procs[handle.job_id] = _FakeProc(handle, dead=True)
        return False

    def handles(self) -> dict[str, Handle]:
        return {j: p.handle for j, p in self._procs.items() if p.watched and not p.dead}

    def shutdown(self) -> None:
        """Stop watching; fake jobs keep "running" and can be adopted again."""
        self.calls.append(("shutdown", ""))
        for proc in self._procs.values():
            proc.watched = False


if TYPE_CHECKING:  # mypy proves it implements the protocol the scheduler loop uses
    _FAKE: Executor = FakeExecutor()
