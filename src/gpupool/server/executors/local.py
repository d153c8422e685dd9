"""Run jobs as real processes on this node, stop them politely, and tell how they ended.

Each attempt runs under the shim (gpupool.server.executors.shim) in its own session and process
group, so preemption signals reach the job and everything it started, and so jobs outlive
a restart of the scheduler. The shim leaves ``exit-<attempt>.json`` in the job's run
directory; that file, not the parent/child relation, is the source of truth after a
restart. A missing command is not refused at launch: the shim reports it, and the next
poll returns outcome "failed" with reason "command not found: X" (PATH lookup depends on
the job's own environment, so only the job can tell).

Containment: where cgroups are writable each attempt gets its own cgroup (limits, GPU
devices), and the shim is put in it before it is handed the job, so every process of the
job is in it, setsid() children included; an attempt is reported ended only once its
cgroup is empty. Before the shim starts, ``launch-<attempt>.json`` records the attempt's
launch token and cgroup (atomically; it need not outlive the machine, as the processes it
finds cannot), so a restarted scheduler finds the attempt's processes
(by cgroup, or by the token in their environment without cgroups) instead of starting a
second copy. With a `JobUser`, the job runs as that user and its run directory is laid
out so it reads and writes only its own checkpoint and home directories and reads its
own logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.errors import ConflictError, SpecError
from gpupool.ports.executor.base import (
    DEFAULT_GRACE_S,
    MULTI_NODE_REFUSED,
    Exit,
    Handle,
    LaunchSpec,
    classify,
    validate,
)
from gpupool.ports.executor.stops import ask_stop, watched
from gpupool.server.agent.processes import cmdline, read_start_ticks
from gpupool.server.agent.start import (
    SHIM_MODULES,
    AttemptProcesses,
    Containment,
    start_attempt,
)
from gpupool.server.executors.files import (
    DEFAULT_LOG_MAX_BYTES,
    exit_file,
    launch_file,
    read_json,
    stop_file,
    write_json,
)
from gpupool.server.isolation import cgroups as cg
from gpupool.server.isolation.cgroups import BASE_DEVICES, Cgroups, DeviceRule

if TYPE_CHECKING:
    from gpupool.ports.executor.base import Executor


# --------------------------------------------------------------------------- /proc


# --------------------------------------------------------------------------- local


@dataclass
class _Watched:
    """Mutable bookkeeping for one attempt we watch."""

    handle: Handle
    run_dir: Path
    proc: subprocess.Popen[bytes] | None  # None: adopted, not our child
    stop_kind: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    deadline_s: float | None = None
    kill_sent: bool = False
    sigterm_at_wall_s: float | None = None  # time.time() of our first SIGTERM
    dead: bool = False  # adopted but found gone: report on next poll
    pidfd: int | None = None  # adopted: readable once the process has exited
    exit_fd: int | None = None  # a pidfd of the shim in the exit watch (watch_exits)
    status: tuple[int | None, int | None, bool] | None = None
    """Once the shim has ended: (exit code, signal, whether its wait status was seen);
    the attempt is reported once the rest of it (its cgroup) is gone too."""

    def stop_state(self) -> dict[str, object]:
        return {
            "kind": self.stop_kind,
            "grace_s": self.grace_s,
            "deadline_s": self.deadline_s,
            "kill_sent": self.kill_sent,
            "sigterm_at_wall_s": self.sigterm_at_wall_s,
        }

    def load_stop_state(self, stop: Mapping[str, Any]) -> None:
        if stop.get("kind") not in ("preempt", "cancel"):
            return
        self.stop_kind = str(stop["kind"])
        grace = stop.get("grace_s")
        self.grace_s = float(grace) if isinstance(grace, int | float) else DEFAULT_GRACE_S
        deadline = stop.get("deadline_s")
        self.deadline_s = float(deadline) if isinstance(deadline, int | float) else None
        self.kill_sent = bool(stop.get("kill_sent"))
        sent = stop.get("sigterm_at_wall_s")
        self.sigterm_at_wall_s = float(sent) if isinstance(sent, int | float) else None


def _open_pidfd(handle: Handle) -> int | None:
    """A pidfd for the adopted shim, or None (old kernel, out of descriptors): then poll
    falls back to reading /proc/<pid>/stat each time."""
    try:
        fd = os.pidfd_open(handle.pid)
    except (OSError, AttributeError):
        return None
    if read_start_ticks(handle.pid, zombie_ok=True) != handle.start_ticks:
        os.close(fd)  # the pid was reused between our check and the open
        return None
    return fd


# Popen objects of jobs left running at shutdown(): kept referenced so that the
# subprocess module neither warns about them nor reaps them behind an adopter's back.
_DETACHED: list[subprocess.Popen[bytes]] = []

AUTO = "auto"


class LocalExecutor:
    """Runs each attempt under the shim (`shim_command`, `--exit-file ... --spec-fd N`).

    `cgroups`: "auto" finds the hierarchy to use (cgroups.detect), None runs without
    (processes are then found by their launch token). `log_max_bytes`: each of a job's
    two logs is rotated at this size (one `.1` kept); None: no cap, the job writes its
    logs itself. `isolation`: the policy that gives each job its user and limits (read
    by the scheduler loop when it builds a LaunchSpec); it also sets the log cap.

    poll() costs one waitid() per child job (about 1 µs) and one poll(2) over the pidfds
    of all adopted jobs; it reads exit records and cgroups only for jobs that ended.
    Grace deadlines are kept in the caller's clock (`now_s`) and in stop-<attempt>.json
    so that a restarted scheduler enforces them: pass wall-clock seconds (time.time()).
    Not thread-safe: call it from the scheduler loop only. Linux only."""

    def __init__(
        self,
        python: str = sys.executable,
        *,
        cgroups: Cgroups | str | None = AUTO,
        log_max_bytes: int | None = DEFAULT_LOG_MAX_BYTES,
        devices_dir: Path = Path("/dev"),
        base_devices: tuple[DeviceRule, ...] = BASE_DEVICES,
        isolation: Any = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.address = address
        """This machine's node address (`node_address`)."""
        self._python = python
        self._jobs: dict[str, _Watched] = {}
        # Adopted jobs are not our children, so waitid cannot see them end; a pidfd per
        # job and one poll(2) over all of them costs less than reading /proc for each.
        self._pidfds = select.poll()
        if isinstance(cgroups, str):
            found, self.cgroups_note = cg.detect()
            self.cgroups: Cgroups | None = found
        else:
            self.cgroups = cgroups
            self.cgroups_note = (
                f"cgroups {cgroups.version}" if cgroups is not None else "cgroups disabled"
            )
        self.isolation = isolation
        if isolation is not None and hasattr(isolation, "log_max_bytes"):
            log_max_bytes = isolation.log_max_bytes
        self.log_max_bytes = log_max_bytes
        self._devices_dir = devices_dir
        self._base_devices = base_devices
        self._priming: threading.Thread | None = None
        self._exit_watch: tuple[select.epoll, int] | None = None  # epoll, its stop pipe
        self.exit_watch_limit = _descriptor_limit() // 4
        """At most this many pidfds of our own children in the exit watch (an adopted
        job's pidfd is shared with poll): jobs past it end at the next cycle, as before,
        rather than take the descriptors the server needs (the soft limit is often 1024)."""
        self._exit_fds = 0

    @property
    def containment(self) -> Containment:
        """How this machine's attempts are contained (the node agent's settings)."""
        return Containment(self.cgroups, self.log_max_bytes, self._devices_dir, self._base_devices)

    def node_address(self, node: str) -> str:
        """Every node of the local executor is this machine: its address."""
        return self.address

    def cannot_guarantee(self) -> list[str]:
        """What this executor cannot enforce here, one sentence each (logged at start)."""
        if self.cgroups is None:
            return [f"{self.cgroups_note}; {cg.WITHOUT_CGROUPS}"]
        return self.cgroups.cannot_guarantee()

    # ---- watching ends as they happen

    def watch_exits(self, wake: Callable[[], None]) -> None:
        """From now on, call `wake` (from a helper thread) as soon as a watched attempt's
        shim ends, so that the loop reaps it at once rather than at its next cycle: its
        GPUs are free for the next job up to a cycle sooner, and the next submit's step
        does not reap it first. Once per executor; shutdown() stops it."""
        if self._exit_watch is not None:
            return
        epoll = select.epoll()
        stop_r, stop_w = os.pipe()
        epoll.register(stop_r, select.EPOLLIN)
        self._exit_watch = (epoll, stop_w)
        for job in self._jobs.values():
            self._watch_exit(job)
        threading.Thread(
            target=_wait_for_exits,
            args=(epoll, stop_r, wake),
            name="gpupool-exit-watch",
            daemon=True,
        ).start()

    def _watch_exit(self, job: _Watched) -> None:
        """Put the job's shim in the exit watch (a pidfd of its own, reported once)."""
        if self._exit_watch is None or job.dead or job.exit_fd is not None:
            return
        own = job.proc is not None
        if own and self._exit_fds >= self.exit_watch_limit:
            return  # the cycle's poll finds its end
        try:
            if job.proc is not None:  # our child: its pid is ours until we reap it
                fd = os.pidfd_open(job.proc.pid)
            elif job.pidfd is not None:
                fd = job.pidfd  # adopted: the pidfd poll() reads, in the watch too
            else:
                return  # no pidfd here: the cycle's poll still finds its end
        except OSError:
            return
        try:
            self._exit_watch[0].register(fd, select.EPOLLIN | select.EPOLLONESHOT)
        except OSError:
            if own:
                os.close(fd)
            return
        job.exit_fd = fd
        self._exit_fds += own

    def _unwatch_exit(self, job: _Watched) -> None:
        if job.exit_fd is None:
            return
        if self._exit_watch is not None:
            with contextlib.suppress(OSError, ValueError):
                self._exit_watch[0].unregister(job.exit_fd)
        if job.exit_fd != job.pidfd:  # our own pidfd; an adopted job's is closed by _forget
            os.close(job.exit_fd)
            self._exit_fds -= 1
        job.exit_fd = None

    # ---- starting

    def expect_launch(self) -> None:
        """A launch may follow within a few ms (the loop was woken, e.g. by a submit):
        prime the cgroups (Cgroups.prime) on a helper thread, so that the shim's move into
        its cgroup does not wait out the kernel's grace period on the way to the job's
        start. At most one at a time; nothing without cgroups."""
        prime = getattr(self.cgroups, "prime", None)
        if prime is None or (self._priming is not None and self._priming.is_alive()):
            return
        self._priming = threading.Thread(target=prime, name="gpupool-cgroup-prime", daemon=True)
        self._priming.start()

    runs_gangs = False
    """One machine: a job placed over several nodes is refused (MULTI_NODE_REFUSED)."""

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        validate(spec)
        if spec.gang is not None and len(spec.gang.members) > 1:
            raise SpecError(f"job {spec.job_id}: {MULTI_NODE_REFUSED}")
        if spec.job_id in self._jobs:
            raise ConflictError(
                f"job {spec.job_id} is already watched here (attempt "
                f"{self._jobs[spec.job_id].handle.attempt}); poll until it ends before "
                "launching it again"
            )
        self.expect_launch()  # unless the loop already did: the wait starts before the intent
        started = start_attempt(spec, python=self._python, containment=self.containment)
        proc = started.proc
        handle = Handle(
            spec.job_id,
            spec.attempt,
            proc.pid,
            proc.pid,
            started.ticks,
            started.token,
            started.cgroup,
        )
        self._jobs[spec.job_id] = watched = _Watched(handle, spec.run_dir.absolute(), proc)
        self._watch_exit(watched)
        return handle

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """Watch an attempt started by an earlier scheduler. True if its shim still runs;
        else False, and the next poll reports its end (from its exit record, or "lost")
        once whatever is left of it (in its cgroup, or carrying its token) is killed.

        A handle with pid 0 (the scheduler died before it learnt the shim's pid) is
        completed from the attempt's processes; handles() then shows the real pid."""
        if handle.job_id in self._jobs:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
        run_dir = run_dir.absolute()
        intent = read_json(launch_file(run_dir, handle.attempt)) or {}
        if not handle.token and isinstance(intent.get("token"), str):
            handle = dataclasses.replace(handle, token=intent["token"])
        if not handle.cgroup and isinstance(intent.get("cgroup"), str):
            handle = dataclasses.replace(handle, cgroup=intent["cgroup"])
        if handle.pid <= 0 or not self._is_our_shim(handle, run_dir):
            for pid in self._processes(handle).members():
                ticks = read_start_ticks(pid)
                found = dataclasses.replace(handle, pid=pid, pgid=pid, start_ticks=ticks or 0)
                if ticks is not None and self._is_our_shim(found, run_dir):
                    handle = found
                    break
        job = _Watched(handle, run_dir, None)
        stop = read_json(stop_file(run_dir, handle.attempt))
        if stop is not None:
            job.load_stop_state(stop)
        job.dead = handle.pid <= 0 or not self._is_our_shim(handle, run_dir)
        if not job.dead:
            job.pidfd = _open_pidfd(handle)
            if job.pidfd is not None:
                self._pidfds.register(job.pidfd, select.POLLIN)
        self._jobs[handle.job_id] = job
        self._watch_exit(job)
        return not job.dead

    @staticmethod
    def _is_our_shim(handle: Handle, run_dir: Path) -> bool:
        if read_start_ticks(handle.pid) != handle.start_ticks:
            return False
        # Same pid and start time is the same process within one boot; the shim's exit
        # file also rules out a later boot that happened to reuse both. Compared resolved,
        # so a run_dir spelled another way (relative, through a symlink) still matches.
        argv = cmdline(handle.pid)
        if not any(m in argv for m in SHIM_MODULES) or "--exit-file" not in argv:
            return False
        at = argv.index("--exit-file") + 1
        if at >= len(argv):
            return False
        return Path(argv[at]).resolve() == exit_file(run_dir, handle.attempt).resolve()

    def _processes(self, handle: Handle) -> AttemptProcesses:
        return AttemptProcesses(handle.pgid, handle.token, handle.cgroup, self.cgroups)

    # ---- stopping

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "preempt", grace_s, now_s)

    can_resize = True

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        """Its processes checkpoint and leave as for a preemption (the exit says
        "preempted"); the service, not this executor, relaunches it on its new GPUs."""
        self._stop(job_id, "preempt", grace_s, now_s)

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "cancel", grace_s, now_s)

    def _stop(self, job_id: str, kind: str, grace_s: float, now_s: float) -> None:
        job = watched(self._jobs, job_id)
        if not self._alive(job):
            return  # it ended by itself; the next poll says how
        ask_stop(job, kind, grace_s, now_s)
        if job.sigterm_at_wall_s is None:
            job.sigterm_at_wall_s = time.time()
        self._save_stop_state(job)
        self._signal(job, signal.SIGTERM)
        self._enforce(job, now_s)

    def _save_stop_state(self, job: _Watched) -> None:
        # Best effort: losing it only matters if the scheduler also restarts meanwhile.
        with contextlib.suppress(OSError):
            write_json(stop_file(job.run_dir, job.handle.attempt), job.stop_state())

    def _alive(self, job: _Watched) -> bool:
        """Still running (not exited, not even a zombie waiting for us)."""
        if job.dead or job.status is not None:
            return False
        if job.proc is not None:
            if job.proc.returncode is not None:
                return False
            try:
                return os.waitid(os.P_PID, job.proc.pid, _PEEK) is None
            except ChildProcessError:
                return False
        return read_start_ticks(job.handle.pid) == job.handle.start_ticks

    def _signal(self, job: _Watched, sig: int) -> None:
        # A child's pid is ours until we reap it; an adopted job is checked just before.
        if job.proc is None and not self._alive(job):
            return
        self._processes(job.handle).signal(sig)

    def _enforce(self, job: _Watched, now_s: float) -> None:
        if job.kill_sent or job.deadline_s is None or now_s < job.deadline_s:
            return
        self._signal(job, signal.SIGKILL)
        job.kill_sent = True
        self._save_stop_state(job)

    # ---- watching

    def poll(self, now_s: float) -> list[Exit]:
        exits: list[Exit] = []
        exited_fds = {fd for fd, _ in self._pidfds.poll(0)}
        for job_id, job in list(self._jobs.items()):
            if not job.dead and job.status is None:
                self._enforce(job, now_s)
            ended = self._reap(job, now_s, exited_fds)
            if ended is not None:
                exits.append(ended)
                self._forget(job_id)
        return exits

    def _forget(self, job_id: str) -> None:
        job = self._jobs.pop(job_id)
        self._unwatch_exit(job)
        if job.pidfd is not None:
            self._pidfds.unregister(job.pidfd)
            os.close(job.pidfd)
            job.pidfd = None

    def _shim_status(
        self, job: _Watched, exited_fds: set[int]
    ) -> tuple[int | None, int | None, bool] | None:
        """None while the shim runs; then (exit code, signal, status known)."""
        if job.proc is not None:
            try:
                if os.waitid(os.P_PID, job.proc.pid, _PEEK) is None:
                    return None
                # The zombie still holds the group id: kill whatever the job left behind
                # (only possible if the shim itself was killed) before the id is reused.
                with contextlib.suppress(OSError):
                    os.killpg(job.handle.pgid, signal.SIGKILL)
                status = job.proc.wait()
                return (None, -status, True) if status < 0 else (status, None, True)
            except ChildProcessError:
                return (None, None, False)  # reaped by someone else: only the record tells
        if not job.dead:
            if job.pidfd is not None:
                if job.pidfd not in exited_fds:
                    return None
            elif read_start_ticks(job.handle.pid) == job.handle.start_ticks:
                return None
        return (None, None, False)

    def _reap(self, job: _Watched, now_s: float, exited_fds: set[int]) -> Exit | None:
        if job.status is None:
            job.status = self._shim_status(job, exited_fds)
            if job.status is None:
                return None
        h = job.handle
        # The attempt has ended only when nothing of it is left: until then its GPUs are
        # not free. What the shim left (escaped children) is killed here.
        if not self._processes(h).end():
            return None
        code, sig, status_known = job.status
        stop_kind, kill_sent = job.stop_kind, job.kill_sent
        record = read_json(exit_file(job.run_dir, h.attempt))
        if record is not None:
            ended_at = record.get("ended_at")
            sent = job.sigterm_at_wall_s
            if isinstance(ended_at, int | float) and sent is not None and ended_at < sent:
                stop_kind, kill_sent = None, False  # it had ended before we asked
            rec_code, rec_sig, error = (record.get(k) for k in ("exit_code", "signal", "error"))
            code = rec_code if isinstance(rec_code, int) else None
            sig = rec_sig if isinstance(rec_sig, int) else None
            status_known = True
        return classify(
            h.job_id,
            h.attempt,
            exit_code=code,
            signal_num=sig,
            at_s=now_s,
            stop_kind=stop_kind,
            kill_sent=kill_sent,
            grace_s=job.grace_s,
            error=error if record is not None and isinstance(error, str) else None,
            vanished=not status_known,
        )

    def handles(self) -> dict[str, Handle]:
        return {job_id: j.handle for job_id, j in self._jobs.items() if not j.dead}

    def shutdown(self) -> None:
        """Stop watching; the jobs keep running for the next scheduler to adopt."""
        for job_id, job in list(self._jobs.items()):
            if job.proc is not None and job.proc.returncode is None:
                _DETACHED.append(job.proc)
            self._forget(job_id)
        if self._exit_watch is not None:
            _, stop_w = self._exit_watch
            self._exit_watch = None
            os.close(stop_w)  # the watcher sees its stop pipe end, and closes the rest


def _descriptor_limit() -> int:
    """This process's soft limit on open descriptors (RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _wait_for_exits(epoll: select.epoll, stop_r: int, wake: Callable[[], None]) -> None:
    """The exit watch's thread: `wake` whenever a watched shim's pidfd says it ended,
    until the stop pipe's write end is closed."""
    try:
        while True:
            events = epoll.poll()
            if any(fd == stop_r for fd, _ in events):
                return
            if events:
                wake()
    finally:
        os.close(stop_r)
        epoll.close()


_PEEK = os.WEXITED | os.WNOHANG | os.WNOWAIT


if TYPE_CHECKING:  # mypy proves it implements the protocol the scheduler loop uses
    _LOCAL: Executor = LocalExecutor()
