"""Free space on the state directory's filesystem, and the floor below which launches wait.

A job that fills the state disk must not take the scheduler with it: below the floor no
new process starts (each start writes logs, a handle file and database rows), so what is
left stays for the database and the jobs that already run. The probe is an interface so
tests can make a disk full without filling one (`FakeDisk`); `StatvfsDisk` is the real one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

MIB = 1 << 20
DEFAULT_FLOOR_MIB = 1024.0
DEFAULT_FLOOR_PCT = 5.0


@dataclass(frozen=True)
class DiskSpace:
    """What one statvfs says about the filesystem holding `path`."""

    path: str
    free_bytes: int
    """Bytes an unprivileged writer may still use (f_bavail)."""
    total_bytes: int
    read_only: bool


class DiskProbe(Protocol):
    def space(self) -> DiskSpace: ...


class StatvfsDisk:
    """The filesystem of `path`, read with statvfs(2): no file descriptor, so it still
    answers when the process has run out of them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def space(self) -> DiskSpace:
        st = os.statvfs(self.path)
        return DiskSpace(
            str(self.path),
            st.f_bavail * st.f_frsize,
            st.f_blocks * st.f_frsize,
            bool(st.f_flag & os.ST_RDONLY),
        )


class FakeDisk:
    """A disk whose free space and read-only flag a test sets."""

    def __init__(
        self, free_bytes: int = 100 << 30, total_bytes: int = 200 << 30, path: str = "/fake"
    ) -> None:
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes
        self.read_only = False
        self.path = path

    def space(self) -> DiskSpace:
        return DiskSpace(self.path, self.free_bytes, self.total_bytes, self.read_only)


@dataclass(frozen=True)
class DiskFloor:
    """Launches wait while free space is below min(floor_mib, floor_pct of the disk)."""

    floor_mib: float = DEFAULT_FLOOR_MIB
    floor_pct: float = DEFAULT_FLOOR_PCT

    def floor_bytes(self, total_bytes: int) -> int:
        return int(min(self.floor_mib * MIB, total_bytes * self.floor_pct / 100.0))

    def problem(self, space: DiskSpace) -> str | None:
        """Why launches must wait on this disk (the job's reason), or None."""
        if space.read_only:
            return (
                f"ReadOnly: the state directory's filesystem ({space.path}) is mounted "
                "read-only; launches wait until it is writable again"
            )
        floor = self.floor_bytes(space.total_bytes)
        if space.free_bytes < floor:
            return (
                f"DiskFull: the state directory's filesystem ({space.path}) has less than "
                f"{floor / MIB:.0f} MiB free; launches wait until space is freed "
                "(see gpupool serve --disk-floor-mib/--disk-floor-pct)"
            )
        return None
