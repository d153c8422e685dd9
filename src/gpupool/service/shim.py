"""Runs one job attempt as a child and leaves an exit record behind.

The scheduler cannot rely on being the job's parent: it may be restarted while the job runs,
and then only a file tells it how the job ended. This process sits between the two. It
survives the group SIGTERM of a preemption (the job gets it and checkpoints; we keep
waiting), then writes ``{"exit_code", "signal", "ended_at"}`` atomically and exits with the
job's code. Only SIGKILL stops it early, and then the executor knows whether it sent it.

Usage: ``python -m gpupool.service.shim --exit-file PATH -- COMMAND [ARGS...]``.

It imports nothing from gpupool so that it starts fast and a broken install cannot break
the record of a job's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_USAGE = "usage: python -m gpupool.service.shim --exit-file PATH -- COMMAND [ARGS...]"


def _keep_waiting(signum: int, frame: FrameType | None) -> None:
    """A no-op handler rather than SIG_IGN: handlers fall back to default across exec, so
    the job starts with default dispositions, while an ignored signal would stay ignored."""


def write_record(path: Path, record: dict[str, object]) -> None:
    """Write the record so that a reader sees either nothing or all of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


FENCE_ENV = "GPUPOOL_FENCE_PPID"
"""Set by a launcher whose death must end the job (a Ray actor: its node is gone)."""


def _fence(parent: int, every_s: float = 0.5) -> None:
    """When the launcher that must outlive the job dies (we are re-parented), nobody can
    stop the job any more and the scheduler will restart it elsewhere: kill the group."""
    while True:
        time.sleep(every_s)
        if os.getppid() != parent:
            print(
                f"gpupool: the job's launcher (pid {parent}) is gone; stopping the job",
                file=sys.stderr,
                flush=True,
            )
            pgid = os.getpgrp()
            if pgid == os.getpid():
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)  # us included: no record, it is "lost"
            os._exit(137)


def _parse(argv: list[str]) -> tuple[Path, list[str]]:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        raise SystemExit(_USAGE)
    return Path(argv[1]), argv[3:]


def main(argv: list[str] | None = None) -> int:
    exit_file, command = _parse(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _keep_waiting)
    error: str | None = None
    exit_code: int | None
    sig_num: int | None = None
    fence = os.environ.pop(FENCE_ENV, "")
    if fence.isdigit():
        threading.Thread(target=_fence, args=(int(fence),), daemon=True).start()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        exit_code, error = EXIT_NOT_FOUND, f"command not found: {command[0]}"
    except PermissionError:
        exit_code, error = EXIT_NOT_EXECUTABLE, f"command not executable: {command[0]}"
    except OSError as e:
        exit_code, error = EXIT_NOT_EXECUTABLE, f"cannot start {command[0]}: {e.strerror}"
    else:
        status = child.wait()
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
    return exit_code if exit_code is not None else 128 + (sig_num or 0)


if __name__ == "__main__":
    sys.exit(main())
