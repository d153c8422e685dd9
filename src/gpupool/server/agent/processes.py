"""A machine's processes as the agent sees them: a process named by pid and start ticks
(the same process within one boot), the processes carrying an attempt's launch token, and
process groups. Linux /proc only."""

from __future__ import annotations

import os

TOKEN_ENV = "GPUPOOL_LAUNCH_TOKEN"
"""Every process of an attempt carries its launch token in its environment: how its
processes are found where there are no cgroups."""


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


def alive(pid: int, ticks: int) -> bool:
    """The very process (pid and start ticks) still runs (a zombie has ended)."""
    return pid > 0 and read_start_ticks(pid) == ticks


def cmdline(pid: int) -> list[str]:
    """The process's arguments; [] when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


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


def pgid_of(pid: int) -> int | None:
    """The process group of `pid`; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[2]) if len(fields) > 2 else None
