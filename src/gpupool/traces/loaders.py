"""Pick the right reader for a replay trace: a file, or a folder of per-cluster files."""

from __future__ import annotations

from pathlib import Path

from gpupool.core.model import JobSpec
from gpupool.errors import NotFoundError, SpecError
from gpupool.traces.common import ReadReport
from gpupool.traces.itp import itp_cluster_files, read_itp
from gpupool.traces.philly import read_elasticflow_philly

REPLAY_FORMATS = ("itp", "elasticflow")


def _header(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as handle:
        return [h.strip() for h in handle.readline().split(",")]


def load_replay_trace(path: Path, fmt: str) -> list[tuple[str, list[JobSpec], ReadReport]]:
    """(cluster name, jobs, report) for each cluster the trace describes."""
    if fmt not in REPLAY_FORMATS:
        raise SpecError(f"unknown trace format {fmt!r}; choose one of {', '.join(REPLAY_FORMATS)}")
    if not path.exists():
        raise NotFoundError(f"trace {path} does not exist; check the path")
    files = itp_cluster_files(path, "raw" if fmt == "itp" else "elasticflow")
    out: list[tuple[str, list[JobSpec], ReadReport]] = []
    for f in files:
        if fmt == "elasticflow" and "submit_time" in _header(f):
            jobs, report = read_elasticflow_philly(f)
        else:
            jobs, report = read_itp(f, "raw" if fmt == "itp" else "elasticflow")
        out.append((f.stem, jobs, report))
    return out
