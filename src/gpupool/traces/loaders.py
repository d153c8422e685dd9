"""Pick the right reader for a replay trace: a file, or a folder of per-cluster files."""

from __future__ import annotations

from pathlib import Path

from gpupool.domain.model import JobSpec
from gpupool.errors import NotFoundError, SpecError
from gpupool.traces.common import ReadReport
from gpupool.traces.itp import itp_cluster_files, read_itp
from gpupool.traces.philly import (
    gavel_vc,
    read_elasticflow_philly,
    read_gavel_msr,
    read_pollux_philly,
)

REPLAY_FORMATS = ("itp", "elasticflow", "gavel", "pollux")
GAVEL_SUFFIX = ".trace.txt"


def _header(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as handle:
        return [h.strip() for h in handle.readline().split(",")]


def gavel_trace_files(path: Path) -> list[Path]:
    """One Gavel msr trace, or every `*.trace.txt` of a folder (one per Philly VC), by name."""
    if path.is_file():
        return [path]
    found = sorted(
        (f for f in path.iterdir() if f.is_file() and f.name.endswith(GAVEL_SUFFIX)),
        key=lambda f: f.name,
    )
    if not found:
        raise NotFoundError(
            f"no *{GAVEL_SUFFIX} files in {path}; pass a Gavel msr trace or the folder of "
            "per-VC traces (e.g. philly/gavel-msr-traces-seed0)"
        )
    return found


def load_replay_trace(path: Path, fmt: str) -> list[tuple[str, list[JobSpec], ReadReport]]:
    """(cluster name, jobs, report) for each cluster the trace describes."""
    if fmt not in REPLAY_FORMATS:
        raise SpecError(f"unknown trace format {fmt!r}; choose one of {', '.join(REPLAY_FORMATS)}")
    if not path.exists():
        raise NotFoundError(f"trace {path} does not exist; check the path")
    out: list[tuple[str, list[JobSpec], ReadReport]] = []
    if fmt == "pollux":  # one file, every VC in it: one shared pool, the VC as the team
        if not path.is_file():
            raise SpecError(f"{path}: --format pollux reads one file (philly-pollux/philly.csv)")
        jobs, report = read_pollux_philly(path)
        return [(path.stem, jobs, report)]
    if fmt == "gavel":
        for f in gavel_trace_files(path):
            jobs, report = read_gavel_msr(f)
            out.append((gavel_vc(f), jobs, report))
        return out
    files = itp_cluster_files(path, "raw" if fmt == "itp" else "elasticflow")
    for f in files:
        if fmt == "elasticflow" and "submit_time" in _header(f):
            jobs, report = read_elasticflow_philly(f)
        else:
            jobs, report = read_itp(f, "raw" if fmt == "itp" else "elasticflow")
        out.append((f.stem, jobs, report))
    return out
