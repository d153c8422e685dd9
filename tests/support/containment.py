"""What the containment tests need from this machine: root, writable cgroups, useradd.

Without them the tests skip with the reason, unless GPUPOOL_REQUIRE_ISOLATION=1 (the
Makefile sets it), in which case they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.server.isolation import cgroups


def missing() -> str | None:
    """Why jobs cannot be contained here, or None."""
    if os.geteuid() != 0:
        return "not root: jobs cannot be run as other users or put in cgroups"
    found, note = cgroups.detect()
    if found is None:
        return f"no writable cgroups: {note}"
    if shutil.which("useradd") is None:
        return "no useradd: team users cannot be created"
    return None


def require() -> None:
    why = missing()
    if why is None:
        return
    if os.environ.get("GPUPOOL_REQUIRE_ISOLATION") == "1":
        pytest.fail(f"GPUPOOL_REQUIRE_ISOLATION=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh directory every user can traverse (pytest's own tmp is root's alone, so
    a team's user could not reach its job directory under it)."""
    path = Path(tempfile.mkdtemp(prefix="gpupool-contain-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)
