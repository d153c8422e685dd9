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
import json
import marshal
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpupool.errors import ConflictError, NotFoundError, SpecError, Unavailable
from gpupool.server.isolation import cgroups as cg
from gpupool.server.isolation.cgroups import (
    BASE_DEVICES,
    Cgroups,
    DeviceRule,
    Limits,
    gpu_device_rules,
)

SUCCEEDED = "succeeded"
FAILED = "failed"
PREEMPTED = "preempted"
KILLED = "killed"
CANCELLED = "cancelled"
OOM = "oom"
CRASHED = "crashed"
LOST = "lost"
OUTCOMES = frozenset({SUCCEEDED, FAILED, PREEMPTED, KILLED, CANCELLED, OOM, CRASHED, LOST})

DEFAULT_GRACE_S = 60.0
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
CHECKPOINT_DIR = "checkpoint"
HOME_DIR = "home"
DEFAULT_LOG_MAX_BYTES = 64 << 20
TOKEN_ENV = "GPUPOOL_LAUNCH_TOKEN"
CGROUP_PARENT = "gpupool"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
ENV_ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM"})
"""Variables of the server's environment a job inherits (and every LC_*): nothing else of
it (tokens, database URLs, cloud credentials) ever reaches a job."""


def exit_file(run_dir: Path, attempt: int) -> Path:
    """Where the shim records how attempt `attempt` ended."""
    return run_dir / f"exit-{attempt}.json"


def launch_file(run_dir: Path, attempt: int) -> Path:
    """The launch intent of attempt `attempt`: its token and cgroup, written before its
    shim starts, so that a restarted server finds its processes again."""
    return run_dir / f"launch-{attempt}.json"


def stop_file(run_dir: Path, attempt: int) -> Path:
    """Where we remember that we asked attempt `attempt` to stop, so a restarted
    scheduler still calls its end "preempted" rather than "succeeded"."""
    return run_dir / f"stop-{attempt}.json"


NO_LIMITS = Limits()


@dataclass(frozen=True)
class JobUser:
    """The unprivileged Unix user a job runs as (its team's)."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class GangMember:
    """One node's part of a job across nodes: its GPU indices there, as the core chose."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Gang:
    """The members of a job across nodes, rank 0 first (rank 0's node hosts MASTER_PORT).
    `grace_s`: how long the other members get between SIGTERM and SIGKILL when one of
    them ends badly, as a preemption would give them."""

    members: tuple[GangMember, ...]
    grace_s: float = DEFAULT_GRACE_S


MULTI_NODE_REFUSED = (
    "this service runs each job on one machine (the local executor), so a job the core "
    "placed over several nodes cannot start here: run `gpupool serve --ray ADDRESS` to run "
    "jobs across nodes as gangs, or ask for at most one node's GPUs"
)


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of one job. `run_dir` belongs to the job and outlives its attempts.
    `user`: run as this user (None: as the server). `limits`: its cgroup's limits."""

    job_id: str
    attempt: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    gpu_indices: tuple[int, ...]
    run_dir: Path
    resume: bool
    cwd: Path | None = None
    user: JobUser | None = None
    limits: Limits = NO_LIMITS
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES as the job must see it, when not the indices: a card's UUID
    for a client of that card's MPS daemon (the daemon renumbers the devices it sees)."""
    gang: Gang | None = None
    """A job the core placed over several nodes: one member process per node, all or none
    (RayExecutor runs it; LocalExecutor, one machine, refuses it). None: one node."""


@dataclass(frozen=True)
class Handle:
    """Enough to find the attempt again after a restart. `start_ticks` (field 22 of
    /proc/<pid>/stat) tells a recycled pid apart from the job. `token` and `cgroup` (from
    the launch intent) find all its processes; pid 0: the shim's pid is not known yet."""

    job_id: str
    attempt: int
    pid: int
    pgid: int
    start_ticks: int
    token: str = ""
    cgroup: str = ""


@dataclass(frozen=True)
class Exit:
    """How an attempt ended. `exit_code`/`signal` are the job command's own when known
    (the shim's when it left no record); `at_s` is the now_s of the poll that saw it."""

    job_id: str
    attempt: int
    outcome: str
    exit_code: int | None
    signal: int | None
    reason: str
    at_s: float
    node: str | None = None
    """The node the attempt was lost on, when not the job's first (a gang member's)."""


class Executor(Protocol):
    """What the scheduler loop needs from whatever runs the jobs."""

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle: ...

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None: ...

    can_resize: bool
    """It can stop a job's processes and relaunch them on other GPUs (elastic resize)."""

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        """Stop the job's processes as a preemption does (SIGTERM: it checkpoints; grace;
        SIGKILL) so that the service relaunches it on its new GPUs once they exited."""
        ...

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None: ...

    def poll(self, now_s: float) -> list[Exit]: ...

    def adopt(self, handle: Handle, run_dir: Path) -> bool: ...

    def handles(self) -> dict[str, Handle]: ...

    def shutdown(self) -> None: ...


# --------------------------------------------------------------------------- outcomes


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _grace_text(grace_s: float) -> str:
    return f"{grace_s:g} s"


def classify(
    job_id: str,
    attempt: int,
    *,
    exit_code: int | None,
    signal_num: int | None,
    at_s: float,
    stop_kind: str | None = None,
    kill_sent: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    error: str | None = None,
    vanished: bool = False,
) -> Exit:
    """The one place that turns "how it died" plus "what we asked" into an outcome, so the
    live executor and the fake always agree.

    stop_kind is "preempt" or "cancel" once we sent SIGTERM; kill_sent once we sent the
    group SIGKILL. vanished: no exit record and no wait status (node rebooted, or the shim
    was killed while nobody was its parent)."""

    def made(outcome: str, reason: str) -> Exit:
        return Exit(job_id, attempt, outcome, exit_code, signal_num, reason, at_s)

    grace = _grace_text(grace_s)
    stopped = CANCELLED if stop_kind == "cancel" else PREEMPTED
    if kill_sent and (vanished or signal_num == signal.SIGKILL):
        exit_code, signal_num = None, signal.SIGKILL  # ours, even when no one saw it land
        reason = f"killed by SIGKILL after the {grace} grace period"
        if stop_kind == "cancel":
            return made(CANCELLED, reason + " (cancelled)")
        return made(KILLED, reason)
    if vanished:
        return made(
            LOST,
            "the process disappeared without leaving an exit record (the node may have "
            "rebooted); requeue the job, it resumes from its last checkpoint",
        )
    if signal_num is not None:
        ending = f"died of {_signal_name(signal_num)}"
    else:
        ending = f"exited {exit_code}"
    if stop_kind is not None:
        why = "cancellation" if stop_kind == "cancel" else "preemption"
        if signal_num == signal.SIGTERM:
            return made(
                stopped,
                f"ended by the SIGTERM for {why}; the job has no SIGTERM handler, so it saved "
                "no checkpoint on the way out",
            )
        return made(stopped, f"{ending} within the {grace} grace period after SIGTERM for {why}")
    if error is not None:
        return made(FAILED, error)
    if signal_num == signal.SIGKILL:
        return made(
            OOM,
            "killed by SIGKILL that gpupool did not send, usually the kernel's out-of-memory "
            "killer; give the job more memory or make it use less",
        )
    if signal_num is not None:
        return made(CRASHED, ending)
    if exit_code == 0:
        return made(SUCCEEDED, ending)
    return made(FAILED, ending)


# --------------------------------------------------------------------------- /proc


def read_start_ticks(pid: int, *, zombie_ok: bool = False) -> int | None:
    """Field 22 of /proc/<pid>/stat; None if there is no such process, or (unless
    zombie_ok) it has already exited and only waits to be reaped."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    rest = stat[stat.rfind(b")") + 2 :].split()
    if len(rest) < 20 or (not zombie_ok and rest[0] in (b"Z", b"X")):
        return None
    return int(rest[19])


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict(data)), encoding="utf-8")
    os.replace(tmp, path)


def write_atomically(path: Path, data: Mapping[str, object]) -> None:
    """Replace `path` with `data` so that every reader sees the old content or all of the
    new. No fsync: what a launch intent finds again (the attempt's processes, its cgroup)
    lives only as long as the machine does, and every process on it sees the page cache;
    after a crash of the machine there is nothing left to find, and an intent lost with
    it reads as none (recover() then requeues the job, as it does for a torn one). The
    two fsyncs cost 1 to 15 ms on every job's way to its start."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(dict(data)).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def job_environment(spec: LaunchSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of `base` (os.environ: PATH, LANG, LC_*, TZ, TERM) + HOME (the
    job's own home directory) + spec.env + the variables the checkpoint protocol promises.

    CUDA_DEVICE_ORDER=PCI_BUS_ID is forced because our GPU indices are NVML's, which count
    in PCI bus order; CUDA's default order ("fastest first") could name other GPUs."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if k in ENV_ALLOWED or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(spec.run_dir.absolute() / HOME_DIR)
    if spec.user is not None:
        env["USER"] = env["LOGNAME"] = spec.user.name
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = (
        spec.visible_devices
        if spec.visible_devices is not None
        else ",".join(str(i) for i in spec.gpu_indices)
    )
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["GPUPOOL_JOB_ID"] = spec.job_id
    env["GPUPOOL_ATTEMPT"] = str(spec.attempt)
    env["GPUPOOL_CHECKPOINT_DIR"] = str(spec.run_dir.absolute() / CHECKPOINT_DIR)
    if spec.resume:
        env["GPUPOOL_RESUME"] = "1"
    else:
        env.pop("GPUPOOL_RESUME", None)
    return env


def _validate(spec: LaunchSpec) -> None:
    if not spec.argv or not spec.argv[0]:
        raise SpecError(f"job {spec.job_id}: the command is empty; give the program to run")
    if spec.attempt < 1:
        raise SpecError(f"job {spec.job_id}: attempt must be 1 or more, got {spec.attempt}")
    if spec.cwd is not None and not spec.cwd.is_dir():
        raise SpecError(
            f"job {spec.job_id}: working directory {spec.cwd} does not exist; create it or "
            "submit the job without a working directory"
        )


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


def token_pids(token: str) -> list[int]:
    """Processes whose environment carries launch token `token` (those we may read: all
    of them as root). How a job's processes are found where there are no cgroups."""
    if not token:
        return []
    needle = f"{TOKEN_ENV}={token}".encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0") and read_start_ticks(int(name)) is not None:
            found.append(int(name))
    return sorted(found)


def _pgid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[2]) if len(fields) > 2 else None


def _abandon(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap a shim that was never handed its job (a launch that failed after
    it started); it has started nothing."""
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _cgroup_name(job_id: str, attempt: int, token: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:64]
    return f"{CGROUP_PARENT}/job-{safe}-a{attempt}-{token[:12]}"


SHIM_MODULE = "gpupool.server.executors.shim"
SHIM_MODULES = (SHIM_MODULE, "gpupool.service.shim")
"""The names a shim's command line carries: this layout's, and the one before it (shims a
server of the previous release started, adopted after an upgrade)."""
_SHIM_BOOT = (
    "import sys;sys.path.append(sys.argv[2]);del sys.argv[1:3];import shim;sys.exit(shim.main())"
)


def shim_command(python: str = sys.executable) -> list[str]:
    """How a shim is started: `python -I -S -c BOOT gpupool.server.executors.shim DIR`, BOOT
    importing `shim` from DIR, this package's own directory (the shim imports nothing
    from gpupool). -I: neither the job's nor the server's PYTHON* variables, user site or
    working directory can change its code; -S: no site-packages, no .pth files, which
    with -m's runpy were a third of its start-up (13 -> 8 ms on this host); it is the shim
    of this install, not whichever gpupool site-packages names. The module's name stays
    in the command line: adopt() and the tests find a shim by it."""
    return [python, "-I", "-S", "-c", _SHIM_BOOT, SHIM_MODULE, str(Path(__file__).parent)]


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
    ) -> None:
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
        _validate(spec)
        if spec.gang is not None and len(spec.gang.members) > 1:
            raise SpecError(f"job {spec.job_id}: {MULTI_NODE_REFUSED}")
        if spec.job_id in self._jobs:
            raise ConflictError(
                f"job {spec.job_id} is already watched here (attempt "
                f"{self._jobs[spec.job_id].handle.attempt}); poll until it ends before "
                "launching it again"
            )
        self.expect_launch()  # unless the loop already did: the wait starts before the intent
        run_dir = spec.run_dir.absolute()
        self._prepare_dirs(run_dir, spec.user)
        record = exit_file(run_dir, spec.attempt)
        for stale in (record, stop_file(run_dir, spec.attempt)):
            stale.unlink(missing_ok=True)
        token = secrets.token_hex(16)
        group = _cgroup_name(spec.job_id, spec.attempt, token) if self.cgroups else ""
        env = job_environment(spec)
        env[TOKEN_ENV] = token
        cwd = spec.cwd
        if cwd is None and spec.user is not None:
            cwd = run_dir / HOME_DIR  # the server's own directory is none of its business
        job = {
            "argv": list(spec.argv),
            "env": env,
            "cwd": str(cwd) if cwd is not None else None,
            "uid": spec.user.uid if spec.user is not None else None,
            "gid": spec.user.gid if spec.user is not None else None,
            "stdout": str(run_dir / STDOUT_LOG),
            "stderr": str(run_dir / STDERR_LOG),
            "log_max_bytes": self.log_max_bytes,
        }
        header = f"== attempt {spec.attempt} ==\n".encode()
        # The shim starts first, so that its interpreter's start overlaps the intent and
        # the cgroup: until it is handed the job it runs nothing, and should we die before
        # that, it reads EOF and exits without starting the job. The job's processes, the
        # only ones the intent is for, come after the intent and inside the cgroup.
        read_end, write_end = os.pipe()
        argv = [*shim_command(self._python), "--exit-file", str(record)]
        argv += ["--spec-fd", str(read_end)]
        try:
            with (
                open(run_dir / STDOUT_LOG, "ab", buffering=0) as out,
                open(run_dir / STDERR_LOG, "ab", buffering=0) as err,
            ):
                out.write(header)
                err.write(header)
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        env={"PATH": DEFAULT_PATH, TOKEN_ENV: token},
                        cwd=run_dir if spec.user is not None else None,
                        start_new_session=True,
                        pass_fds=(read_end,),
                    )
                except OSError as e:
                    raise SpecError(
                        f"job {spec.job_id}: cannot start the shim {argv[0]}: {e}"
                    ) from e
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        try:
            # The intent before the job's cgroup and processes: whatever exists after it
            # can be found again by it, and cleaned up.
            write_atomically(
                launch_file(run_dir, spec.attempt),
                {"job_id": spec.job_id, "attempt": spec.attempt, "token": token, "cgroup": group},
            )
            if self.cgroups is not None:
                devices = gpu_device_rules(spec.gpu_indices, self._devices_dir, self._base_devices)
                try:
                    self.cgroups.create(group, spec.limits, devices)
                except OSError as e:
                    with contextlib.suppress(OSError):
                        self.cgroups.remove(group)
                    why = f"job {spec.job_id}: cannot create its cgroup {group}: {e}"
                    raise Unavailable(why) from e
        except BaseException:
            _abandon(proc)  # never handed a job: nothing of it ran
            os.close(write_end)
            raise
        # Our child's pid stays ours (a zombie at worst) until we reap it.
        ticks = read_start_ticks(proc.pid, zombie_ok=True) or 0
        handle = Handle(spec.job_id, spec.attempt, proc.pid, proc.pid, ticks, token, group)
        self._jobs[spec.job_id] = watched = _Watched(handle, run_dir, proc)
        self._watch_exit(watched)
        try:
            if self.cgroups is not None:
                self.cgroups.add(group, proc.pid)  # before it has started anything
            with open(write_end, "wb", closefd=False) as pipe:
                pipe.write(marshal.dumps(job))  # the shim reads marshal, not json
        except OSError as e:
            # Not placed, or it died: it never gets the job, and the poll reports it.
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            if not isinstance(e, BrokenPipeError):
                with contextlib.suppress(OSError):
                    err_path = run_dir / STDERR_LOG
                    with open(err_path, "a", encoding="utf-8") as f:
                        f.write(f"gpupool: could not hand the job to its shim: {e}\n")
        finally:
            os.close(write_end)
        return handle

    def _prepare_dirs(self, run_dir: Path, user: JobUser | None) -> None:
        """The run directory: with a user, the server's (0711: the job can reach its own
        parts but not list or change the records in it); checkpoint/ and home/ the job's
        (0700); the logs the server's, readable by the job's group (0640)."""
        for sub in (CHECKPOINT_DIR, HOME_DIR):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        if user is None:
            return
        os.chown(run_dir, 0, 0)
        os.chmod(run_dir, 0o711)
        for sub in (CHECKPOINT_DIR, HOME_DIR):
            os.lchown(run_dir / sub, user.uid, user.gid)
            os.chmod(run_dir / sub, 0o700)
        for name in (STDOUT_LOG, STDERR_LOG):
            path = run_dir / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
            try:
                os.fchown(fd, 0, user.gid)
                os.fchmod(fd, 0o640)
            finally:
                os.close(fd)

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """Watch an attempt started by an earlier scheduler. True if its shim still runs;
        else False, and the next poll reports its end (from its exit record, or "lost")
        once whatever is left of it (in its cgroup, or carrying its token) is killed.

        A handle with pid 0 (the scheduler died before it learnt the shim's pid) is
        completed from the attempt's processes; handles() then shows the real pid."""
        if handle.job_id in self._jobs:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
        run_dir = run_dir.absolute()
        intent = _read_json(launch_file(run_dir, handle.attempt)) or {}
        if not handle.token and isinstance(intent.get("token"), str):
            handle = dataclasses.replace(handle, token=intent["token"])
        if not handle.cgroup and isinstance(intent.get("cgroup"), str):
            handle = dataclasses.replace(handle, cgroup=intent["cgroup"])
        if handle.pid <= 0 or not self._is_our_shim(handle, run_dir):
            for pid in self._members(handle):
                ticks = read_start_ticks(pid)
                found = dataclasses.replace(handle, pid=pid, pgid=pid, start_ticks=ticks or 0)
                if ticks is not None and self._is_our_shim(found, run_dir):
                    handle = found
                    break
        job = _Watched(handle, run_dir, None)
        stop = _read_json(stop_file(run_dir, handle.attempt))
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
        cmdline = _cmdline(handle.pid)
        if not any(m in cmdline for m in SHIM_MODULES) or "--exit-file" not in cmdline:
            return False
        at = cmdline.index("--exit-file") + 1
        if at >= len(cmdline):
            return False
        return Path(cmdline[at]).resolve() == exit_file(run_dir, handle.attempt).resolve()

    def _members(self, handle: Handle) -> list[int]:
        """Every live process of the attempt: its cgroup's members, or (no cgroups) the
        processes carrying its launch token."""
        if handle.cgroup and self.cgroups is not None:
            return self.cgroups.pids(handle.cgroup)
        return token_pids(handle.token)

    def _kill_members(self, handle: Handle) -> None:
        if handle.cgroup and self.cgroups is not None:
            self.cgroups.kill(handle.cgroup)
            return
        killed = token_pids(handle.token)
        for pid in killed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        # A dying process stops showing its environment before it is gone: wait for it
        # (briefly; the next poll looks again) so that "ended" means gone.
        deadline = time.monotonic() + 0.2
        while killed and time.monotonic() < deadline:
            killed = [pid for pid in killed if read_start_ticks(pid) is not None]
            if killed:
                time.sleep(0.002)

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
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(
                f"job {job_id} is not running on this executor; it may have ended already "
                "(poll reports that) or was never launched or adopted here"
            )
        if not self._alive(job):
            return  # it ended by itself; the next poll says how
        grace_s = max(grace_s, 0.0)
        if job.deadline_s is None or now_s + grace_s < job.deadline_s:
            job.deadline_s, job.grace_s = now_s + grace_s, grace_s
        if job.stop_kind != "cancel":
            job.stop_kind = kind  # a cancel during a preemption wins, never the reverse
        if job.sigterm_at_wall_s is None:
            job.sigterm_at_wall_s = time.time()
        self._save_stop_state(job)
        self._signal(job, signal.SIGTERM)
        self._enforce(job, now_s)

    def _save_stop_state(self, job: _Watched) -> None:
        # Best effort: losing it only matters if the scheduler also restarts meanwhile.
        with contextlib.suppress(OSError):
            _write_json(stop_file(job.run_dir, job.handle.attempt), job.stop_state())

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
        with contextlib.suppress(OSError):
            os.killpg(job.handle.pgid, sig)
        if sig == signal.SIGKILL:
            self._kill_members(job.handle)
            return
        # Processes that left the job's process group get the signal too (once each).
        for pid in self._members(job.handle) if job.handle.cgroup else ():
            if _pgid_of(pid) != job.handle.pgid:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)

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
        if self._members(h):
            self._kill_members(h)
            if self._members(h):
                return None
        if h.cgroup and self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.remove(h.cgroup)
        code, sig, status_known = job.status
        stop_kind, kill_sent = job.stop_kind, job.kill_sent
        record = _read_json(exit_file(job.run_dir, h.attempt))
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


# --------------------------------------------------------------------------- fake


@dataclass
class _FakeProc:
    handle: Handle
    watched: bool = True
    dead: bool = False  # adopted but not running: report "lost" on next poll
    stop_kind: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    exit_at_s: float | None = None  # when it leaves by itself after SIGTERM
    kill_at_s: float | None = None
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
    ) -> None:
        self.runs_gangs = runs_gangs
        self.gangs: list[tuple[str, Gang]] = []
        self.exit_after_s = exit_after_s
        self.ignores_sigterm: set[str] = set(ignores_sigterm)
        self.calls: list[tuple[str, str]] = []
        self._procs: dict[str, _FakeProc] = {}
        self._next_pid = 100_000

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        _validate(spec)
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

    def _get(self, job_id: str) -> _FakeProc:
        proc = self._procs.get(job_id)
        if proc is None:
            raise NotFoundError(
                f"job {job_id} is not running on this executor; it may have ended already "
                "(poll reports that) or was never launched or adopted here"
            )
        return proc

    def _stop(self, job_id: str, kind: str, grace_s: float, now_s: float) -> None:
        proc = self._get(job_id)
        if not proc.watched:
            raise NotFoundError(f"job {job_id} is not watched: adopt it first")
        if proc.dead or proc.ended is not None or proc.vanished:
            return
        grace_s = max(grace_s, 0.0)
        if proc.kill_at_s is None or now_s + grace_s < proc.kill_at_s:
            proc.kill_at_s, proc.grace_s = now_s + grace_s, grace_s
        if proc.stop_kind != "cancel":
            proc.stop_kind = kind
        if job_id not in self.ignores_sigterm and proc.exit_at_s is None:
            proc.exit_at_s = now_s + self.exit_after_s

    def finish(self, job_id: str, exit_code: int = 0, signal_num: int | None = None) -> None:
        """The job ends by itself (or dies of `signal_num`); the next poll reports it."""
        proc = self._get(job_id)
        if proc.ended is None:
            proc.ended = (None, signal_num) if signal_num is not None else (exit_code, None)

    def vanish(self, job_id: str) -> None:
        """The process disappears without a record, as in a reboot: outcome "lost"."""
        self._get(job_id).vanished = True

    def poll(self, now_s: float) -> list[Exit]:
        exits: list[Exit] = []
        for job_id, proc in list(self._procs.items()):
            if not proc.watched:
                continue
            if proc.ended is None and not proc.vanished and not proc.dead:
                exit_at_s, kill_at_s = proc.exit_at_s, proc.kill_at_s
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


if TYPE_CHECKING:  # mypy proves both implement the protocol the scheduler loop uses
    _LOCAL: Executor = LocalExecutor()
    _FAKE: Executor = FakeExecutor()
