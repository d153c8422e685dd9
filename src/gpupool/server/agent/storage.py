"""Storage that every node reaches: where checkpoints live so that a job resumed on another
machine, or a gang re-formed elsewhere, finds them.

The `storage:` section of `gpupool serve --config FILE`:

    storage:
      shared_dir: /mnt/gpupool   # mounted at this path on every machine (NFS, CephFS, ...)

Each job's checkpoint directory is `<shared_dir>/checkpoints/<job id>` (its
GPUPOOL_CHECKPOINT_DIR). Without a shared_dir, checkpoints stay in the job's run directory
under the server's state directory, which every job can reach only when the jobs run on
the server's machine (or the state directory is itself shared). A node proves it can write
and read the shared directory (`probe`) before it gets work; one that cannot is out of the
pool with the reason.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError
from gpupool.specfile import SpecReader, config_section

SECTION = "storage"
KEYS = frozenset({"shared_dir"})
CHECKPOINTS = "checkpoints"
PROBES = ".gpupool-probe"


@dataclass(frozen=True)
class StorageConfig:
    """The `storage:` section; shared_dir None: checkpoints in each job's run directory."""

    shared_dir: Path | None = None

    def checkpoint_dir(self, job_id: int | str) -> Path | None:
        """The job's checkpoint directory in shared storage (None: no shared storage)."""
        if self.shared_dir is None:
            return None
        return self.shared_dir / CHECKPOINTS / str(job_id)


def parse_storage(raw: Any, path: str) -> StorageConfig:
    if raw is None:
        return StorageConfig()
    body = SpecReader(path).mapping(raw, SECTION, KEYS)
    shared = body.get("shared_dir")
    if shared is None:
        return StorageConfig()
    if not isinstance(shared, str) or not shared.startswith("/"):
        raise SpecError(
            f"{path}: storage.shared_dir: give an absolute path mounted on every machine, "
            f"got {shared!r}"
        )
    return StorageConfig(Path(shared))


def load_storage(path: Path | None) -> StorageConfig:
    """The `storage:` section of the --config file (defaults when absent)."""
    return parse_storage(config_section(path, SECTION), str(path))


def prepare_shared(shared_dir: Path) -> None:
    """The shared directory's top: checkpoints/ traversable by every team's user (each
    job's own directory below is its user's alone, 0700)."""
    top = shared_dir / CHECKPOINTS
    top.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # not ours to change: it is what it is
        os.chmod(top, 0o711)


def probe(shared_dir: Path, node: str) -> str:
    """Prove this machine writes and reads `shared_dir`: "" when it does, else why not,
    as a sentence an operator can act on."""
    where = shared_dir / PROBES
    token = secrets.token_hex(8)
    path = where / f"{node}.{token}"
    try:
        where.mkdir(parents=True, exist_ok=True)
        path.write_text(token, encoding="utf-8")
        back = path.read_text(encoding="utf-8")
    except OSError as err:
        return (
            f"cannot write and read the shared storage {shared_dir} ({err.strerror or err}): "
            "mount it at the same path on this machine, writable by root"
        )
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    if back != token:
        return f"the shared storage {shared_dir} gave back other bytes than written"
    return ""
