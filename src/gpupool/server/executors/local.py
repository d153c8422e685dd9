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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.errors import ConflictError, SpecError, Unavailable
from gpupool.ports.executor.base import (
    DEFAULT_GRACE_S,
    MULTI_NODE_REFUSED,
    Exit,
    Handle,
    JobUser,
    LaunchSpec,
    classify,
    validate,
)
from gpupool.ports.executor.stops import ask_stop, watched
from gpupool.server.executors.files import (
    CHECKPOINT_DIR,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_PATH,
    HOME_DIR,
    STDERR_LOG,
    STDOUT_LOG,
    exit_file,
    job_environment,
    launch_file,
    read_json,
    stop_file,
    write_atomically,
    write_json,
)
from gpupool.server.isolation import cgroups as cg
from gpupool.server.isolation.cgroups import BASE_DEVICES, Cgroups, DeviceRule, gpu_device_rules

if TYPE_CHECKING:
    from gpupool.ports.executor.base import Executor

TOKEN_ENV = "GPUPOOL_LAUNCH_TOKEN"
CGROUP_PARENT = "gpupool"


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
        intent = read_json(launch_file(run_dir, handle.attempt)) or {}
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
