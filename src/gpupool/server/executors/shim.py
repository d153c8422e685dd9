"""Runs one job attempt as a child and leaves an exit record behind.

The scheduler cannot rely on being the job's parent: it may be restarted while the job runs,
and then only a file tells it how the job ended. This process sits between the two. It
survives the group SIGTERM of a preemption (the job gets it and checkpoints; we keep
waiting), then writes ``{"exit_code", "signal", "ended_at"}`` atomically and exits with the
job's code. Only SIGKILL stops it early, and then the executor knows whether it sent it.

Usage: ``python -I -m gpupool.server.executors.shim --exit-file PATH --spec-fd FD``: the launcher
writes the job (command, environment, user, working directory, log files and cap) as JSON
to the pipe FD and closes it once the shim sits in the job's cgroup. The job's environment
thus reaches the job's process only, never this interpreter (a job's PYTHONPATH or
LD_PRELOAD cannot change gpupool's own code), and a launcher that dies before it has
placed the shim leaves a pipe closed early: the shim then exits without starting the job,
so a crash in the launch window never leaves a job running that nobody knows about.
With ``--spec-fd`` the shim also copies the job's output into its log files, at most
``log_max_bytes`` each, keeping one rotated ``.1`` file, so a job printing forever cannot
fill the disk. The older form ``--exit-file PATH -- COMMAND [ARGS...]`` runs COMMAND in
the shim's own environment, writing straight into the shim's stdout and stderr.

It imports nothing from gpupool so that it starts fast and a broken install cannot break
the record of a job's end. For the same start-up it imports no more than it must: `_signal`
and `_thread` rather than signal (enum) and threading (functools, collections), marshal
rather than json (json loads only to write the record, once the job has ended), and it
starts the job with fork and exec rather than subprocess. Together they were about two
thirds of the time from the shim's exec to the job's.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's own half, without enum
import _thread
import marshal
import os
import sys
import time

TYPE_CHECKING = False  # not typing's: every job waits for the shim to start
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, ClassVar

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_STARTED = 75
SIGNAL_NAMES = {
    _signal.SIGHUP: "SIGHUP",
    _signal.SIGINT: "SIGINT",
    _signal.SIGKILL: "SIGKILL",
    _signal.SIGTERM: "SIGTERM",
}
"""The launcher went away before it handed over the job: nothing was started."""
_USAGE = (
    "usage: python -I -m gpupool.server.executors.shim --exit-file PATH --spec-fd FD\n"
    "       python -m gpupool.server.executors.shim --exit-file PATH -- COMMAND [ARGS...]"
)
DRAIN_S = 1.0
"""How long output still in the pipes is copied after the job's command has ended (a
child that escaped the job may hold them open; its cgroup's end closes them)."""


class _Arrivals:
    """Stop signals that reached the shim while it had no child yet.

    The executor signals the attempt's process group; a SIGTERM sent while the shim is
    still reading the job or starting it reaches the shim alone, and the job started a
    moment later would never hear of it (a time limit or a cancel would then wait out the
    whole grace period). So the shim remembers such signals: one before the spawn means
    the job is not started at all; one during the spawn is passed on to the child."""

    phase: ClassVar[str] = "before"  # "before" the spawn, "spawning", then "running"
    before: ClassVar[list[int]] = []
    during: ClassVar[list[int]] = []


def _keep_waiting(signum: int, frame: FrameType | None) -> None:
    """A handler rather than SIG_IGN: handlers fall back to default across exec, so the job
    starts with default dispositions, while an ignored signal would stay ignored."""
    if _Arrivals.phase == "before":
        _Arrivals.before.append(signum)
    elif _Arrivals.phase == "spawning":
        _Arrivals.during.append(signum)


def write_record(path: str, record: dict[str, object]) -> None:
    """Write the record so that a reader sees either nothing or all of it."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    import json  # here, once the job has ended: not on every job's way to its start

    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _process_group_members(pgid: int) -> list[int]:
    """Pids in our process group other than ourselves, read from /proc."""
    me = os.getpid()
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        # fields[0] is field 3 (state), so field 5 (pgrp) is fields[2].
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def kill_stragglers() -> None:
    """The job ends when its main command ends: kill what it left running in its group,
    so that no orphan keeps the GPUs the scheduler is about to give to someone else.
    While we live the group id cannot be reused, so this never hits a stranger."""
    pgid = os.getpgrp()
    if pgid != os.getpid():
        return  # not started as a group leader (run by hand): the group is not ours
    for _ in range(3):
        members = _process_group_members(pgid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, _signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


FENCE_ENV = "GPUPOOL_FENCE_PPID"
"""Set by a launcher whose death must end the job (a Ray actor: its node is gone)."""


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (when the process started); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rfind(b")") + 2 :].split()
    if len(rest) < 20 or rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])


def _fence(parent: int, every_s: float = 0.5, watched: tuple[int, int] | None = None) -> None:
    """When the launcher that must outlive the job dies (we are re-parented), or the
    process `watched` (pid, start ticks) that stands for the node ends, nobody can stop
    the job any more and the scheduler will restart it elsewhere: kill the group."""
    while True:
        time.sleep(every_s)
        if watched is not None:
            gone = _start_ticks(watched[0]) != watched[1]
            who = f"node's Ray process (pid {watched[0]})"
        else:
            gone = os.getppid() != parent
            who = f"launcher (pid {parent})"
        if gone:
            print(
                f"gpupool: the job's {who} is gone; stopping the job", file=sys.stderr, flush=True
            )
            pgid = os.getpgrp()
            if pgid == os.getpid():
                try:
                    os.killpg(pgid, _signal.SIGKILL)  # us included: no record, it is "lost"
                except OSError:
                    pass
            os._exit(137)


class CappedLog:
    """Copies one of the job's streams into its log file (our own fd `target`), starting a
    new file once it holds `max_bytes` and keeping the previous one as `<path>.1`."""

    def __init__(self, path: str, target: int, max_bytes: int) -> None:
        self.path = path
        self.target = target
        self.max_bytes = max(1, max_bytes)
        self.size = os.fstat(target).st_size

    def _rotate(self) -> None:
        st = os.fstat(self.target)
        try:
            os.replace(self.path, self.path + ".1")
        except OSError:
            pass
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, stat_mode(st.st_mode))
        except OSError:
            pass
        os.dup2(fd, self.target)
        os.close(fd)
        self.size = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.size >= self.max_bytes:
                self._rotate()
            part = view[: self.max_bytes - self.size]
            written = os.write(self.target, part)
            self.size += written
            view = view[written:]

    def copy_from(self, fd: int) -> None:
        """Until EOF on `fd` (every writer gone); a log write error drops the output
        (e.g. a full disk) but keeps reading, so the job never blocks on a full pipe."""
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                return
            if not data:
                return
            try:
                self.write(data)
            except OSError:
                pass


def stat_mode(mode: int) -> int:
    return mode & 0o7777


def _parse(argv: list[str]) -> tuple[str, int | None, list[str]]:
    if len(argv) == 4 and argv[0] == "--exit-file" and argv[2] == "--spec-fd":
        if not argv[3].isdigit():
            raise SystemExit(_USAGE)
        return argv[1], int(argv[3]), []
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        raise SystemExit(_USAGE)
    return argv[1], None, argv[3:]


def _read_spec(fd: int) -> dict[str, Any] | None:
    """The job the launcher handed over, or None if it went away before finishing."""
    chunks = []
    try:
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
    except OSError:
        pass
    os.close(fd)
    try:
        spec = marshal.loads(b"".join(chunks))
    except (ValueError, EOFError, TypeError):
        return None
    return spec if isinstance(spec, dict) and spec.get("argv") else None


def main(argv: list[str] | None = None) -> int:
    exit_file, spec_fd, command = _parse(sys.argv[1:] if argv is None else argv)
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, _keep_waiting)
    spec: dict[str, Any] = {}
    if spec_fd is not None:
        got = _read_spec(spec_fd)
        if got is None:
            print(
                "gpupool: the launcher went away before it handed over the job; not started",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_NOT_STARTED
        spec = got
        command = [str(a) for a in spec["argv"]]
    error: str | None = None
    exit_code: int | None
    sig_num: int | None = None
    fence = str(spec.get("fence_ppid") or os.environ.pop(FENCE_ENV, ""))
    watched = spec.get("fence_watch")
    if isinstance(watched, list) and len(watched) == 2 and all(isinstance(v, int) for v in watched):
        # a warm launcher may be replaced while the job runs: fence on the node instead
        args: tuple[Any, ...] = (0, 0.5, (watched[0], watched[1]))
        _thread.start_new_thread(_fence, args)
    elif fence.isdigit():
        _thread.start_new_thread(_fence, (int(fence),))
    copiers: list[_Copier] = []
    if _Arrivals.before:
        sig_num = _Arrivals.before[0]
        print(
            f"gpupool: stopped by {SIGNAL_NAMES.get(sig_num, f'signal {sig_num}')} before the "
            "job started;"
            " not started",
            file=sys.stderr,
            flush=True,
        )
        write_record(exit_file, {"exit_code": None, "signal": sig_num, "ended_at": time.time()})
        return 128 + sig_num
    try:
        _Arrivals.phase = "spawning"
        child = _start(command, spec, copiers)
    except FileNotFoundError as e:
        if spec.get("cwd") and e.filename == spec.get("cwd"):
            exit_code, error = EXIT_NOT_EXECUTABLE, f"working directory {e.filename} not found"
        else:
            exit_code, error = EXIT_NOT_FOUND, f"command not found: {command[0]}"
    except PermissionError:
        exit_code, error = EXIT_NOT_EXECUTABLE, f"command not executable: {command[0]}"
    except OSError as e:
        exit_code, error = EXIT_NOT_EXECUTABLE, f"cannot start {command[0]}: {e.strerror}"
    else:
        _Arrivals.phase = "running"
        for passed_on in dict.fromkeys(_Arrivals.during):
            try:
                os.kill(child, passed_on)
            except ProcessLookupError:
                pass
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        if status < 0:
            exit_code, sig_num = None, -status
        else:
            exit_code = status
        kill_stragglers()
    if error is not None:
        print(f"gpupool: {error}", file=sys.stderr, flush=True)
    record: dict[str, object] = {"exit_code": exit_code, "signal": sig_num, "ended_at": time.time()}
    if error is not None:
        record["error"] = error
    write_record(exit_file, record)
    # The record first: a kill while the last output drains must not lose how it ended.
    until = time.monotonic() + DRAIN_S
    for copier in copiers:
        copier.join(until - time.monotonic())
    return exit_code if exit_code is not None else 128 + (sig_num or 0)


class _Copier:
    """A log copier on a bare thread (`_thread`: threading's imports cost every job)."""

    def __init__(self, log: CappedLog, fd: int) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()
        _thread.start_new_thread(self._run, (log, fd))

    def _run(self, log: CappedLog, fd: int) -> None:
        try:
            log.copy_from(fd)
        finally:
            self._done.release()

    def join(self, timeout_s: float) -> None:
        if self._done.acquire(True, max(0.0, timeout_s)):
            self._done.release()


def _start(command: list[str], spec: dict[str, Any], copiers: list[_Copier]) -> int:
    """The job's process (its pid): as the spec's user (no supplementary groups), in its
    environment and directory, its output through capped logs when the spec gives a cap."""
    if not spec:
        return _spawn(command, None, None, None, None, None, None)
    uid, gid = spec.get("uid"), spec.get("gid")
    env = spec.get("env")
    cap = spec.get("log_max_bytes")
    logs = [(str(spec[k]), fd) for k, fd in (("stdout", 1), ("stderr", 2)) if spec.get(k)]
    pipes: list[tuple[int, int]] = []
    if isinstance(cap, int) and len(logs) == 2:
        pipes = [os.pipe() for _ in logs]
    try:
        child = _spawn(
            command,
            {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None,
            spec.get("cwd") or None,
            uid if isinstance(uid, int) else None,
            gid if isinstance(gid, int) else None,
            pipes[0][1] if pipes else None,
            pipes[1][1] if pipes else None,
        )
    finally:
        for _, w in pipes:
            os.close(w)
    assert isinstance(cap, int) or not pipes
    for (path, target), (r, _) in zip(logs, pipes, strict=False):
        copiers.append(_Copier(CappedLog(path, target, int(cap or 0)), r))
    return child


def _exec_candidates(program: str, env: dict[str, str] | None) -> list[str]:
    """The paths execvpe would try for `program`, in its order: `program` itself when it
    names a directory, else each PATH entry of the job's environment (os.defpath without
    one). Made here, in the shim, because os.execvpe's own search imports warnings in the
    forked child on every job's way to its exec (about 3 ms)."""
    if os.sep in program:
        return [program]
    path = (os.environ if env is None else env).get("PATH") or os.defpath
    return [os.path.join(d, program) for d in path.split(os.pathsep)]


def _exec(candidates: list[str], argv: list[str], env: dict[str, str] | None) -> None:
    """execve each candidate until one starts; raise as execvpe does when none does (the
    first error other than not-found, else the last not-found)."""
    saved: OSError | None = None
    last: OSError | None = None
    for path in candidates:
        try:
            if env is None:
                os.execv(path, argv)
            else:
                os.execve(path, argv, env)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            last = e
            if saved is None:
                saved = e
    if saved is not None:
        raise saved
    raise last if last is not None else FileNotFoundError(2, os.strerror(2), argv[0])


def _spawn(
    command: list[str],
    env: dict[str, str] | None,
    cwd: str | None,
    uid: int | None,
    gid: int | None,
    stdout: int | None,
    stderr: int | None,
) -> int:
    """fork and exec, as subprocess.Popen would with stdin=DEVNULL, close_fds and
    restore_signals: an error before the exec (directory, user, command) comes back
    through a close-on-exec pipe and is raised here as the OSError it was."""
    candidates = _exec_candidates(command[0], env)
    err_r, err_w = os.pipe()  # close-on-exec: the exec closes it, a failure writes to it
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return into the shim's code
        where = "exec"
        try:
            null = os.open(os.devnull, os.O_RDWR)  # as subprocess.DEVNULL
            os.dup2(null, 0)
            if stdout is not None:
                os.dup2(stdout, 1)
            if stderr is not None:
                os.dup2(stderr, 2)
            os.closerange(3, err_w)
            os.closerange(err_w + 1, 1 << 16)
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores them
                _signal.signal(sig, _signal.SIG_DFL)
            if cwd is not None:
                where = "cwd"
                os.chdir(cwd)
            where = "user"
            if uid is not None:
                os.setgroups([])
            if gid is not None:
                os.setregid(gid, gid)
            if uid is not None:
                os.setreuid(uid, uid)
            where = "exec"
            _exec(candidates, command, env)
        except BaseException as e:  # reported to the shim, whatever it was
            errno = getattr(e, "errno", None) or 0
            try:
                os.write(err_w, f"{errno}:{where}".encode())
            finally:
                os._exit(255)
    os.close(err_w)
    try:
        report = b""
        while True:
            part = os.read(err_r, 64)
            if not part:
                break
            report += part
    finally:
        os.close(err_r)
    if not report:
        return pid
    os.waitpid(pid, 0)
    errno_text, _, where = report.decode().partition(":")
    errno = int(errno_text) if errno_text.isdigit() else 0
    if where == "cwd":
        raise OSError(errno, os.strerror(errno), cwd)
    if where == "user":
        raise OSError(errno, os.strerror(errno))
    raise OSError(errno, os.strerror(errno), command[0])


if __name__ == "__main__":
    sys.exit(main())
