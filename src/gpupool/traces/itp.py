"""Microsoft ITP GPU-cluster traces 2021 (microsoft/elasticflow-traces, ElasticFlow ASPLOS '23).

raw: job_id,submission_time,duration,num_gpu (the measured values).
elasticflow: job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration
(the same jobs; the extra columns were synthesized by the ElasticFlow authors and are ignored).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec
from gpupool.errors import NotFoundError, SpecError, TraceFormatError
from gpupool.traces.common import ReadReport, float_field, int_field, open_rows

FORMATS: dict[str, tuple[str, ...]] = {
    "raw": ("job_id", "submission_time", "duration", "num_gpu"),
    "elasticflow": (
        "job_id",
        "submission_time",
        "num_iteration",
        "model_name",
        "deadline",
        "batch_size",
        "num_gpu",
        "duration",
    ),
}
"""Required columns per form."""

FORMAT_FOLDERS = {"raw": "raw-traces", "elasticflow": "elasticflow-traces"}
"""Folder names the published tarballs unpack to, so the trace root can be passed as is."""

_CLUSTER_FILE = re.compile(r"cluster\d+\.csv")


def _check_format(fmt: str) -> tuple[str, ...]:
    if fmt not in FORMATS:
        raise SpecError(f"unknown ITP trace format {fmt!r}; use one of: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def skip_reason(
    job_id: str, seen: set[str], gpus: int, submit_s: float, duration_s: float
) -> str | None:
    """Why a well-formed job row cannot be replayed, or None; shared with the Philly reader.

    A repeated id is ambiguous (which row is the job?), so every later copy is dropped
    even when the first copy was unusable for another reason.
    """
    if job_id in seen:
        return "duplicate job id"
    seen.add(job_id)
    if gpus <= 0:
        return "no GPU requested"
    if duration_s <= 0:
        return "non-positive duration"
    if submit_s < 0:
        return "negative submit time"
    return None


def training_job(
    report: ReadReport,
    seen: set[str],
    job_id: str,
    gpus: int,
    submit_s: float,
    duration_s: float,
    team: str,
) -> JobSpec | None:
    """A whole-GPU training job from a well-formed row, counted in `report` as used or
    skipped (with skip_reason's reason); shared with the Philly readers."""
    reason = skip_reason(job_id, seen, gpus, submit_s, duration_s)
    if reason:
        report.skip(reason)
        return None
    report.used += 1
    return JobSpec(
        job_id=job_id,
        gpu_count=gpus,
        gpu_milli=MILLI_PER_GPU,
        team=team,
        kind=JobKind.TRAINING,
        submit_s=submit_s,
        duration_s=duration_s,
    )


def read_itp(
    path: str | Path, fmt: str = "raw", cluster: str | None = None
) -> tuple[list[JobSpec], ReadReport]:
    """Read one clusterNN.csv; the team defaults to the file stem so clusters stay apart."""
    required = _check_format(fmt)
    team = cluster if cluster is not None else Path(path).stem
    return read_gpu_job_csv(path, required, "submission_time", team)


def read_gpu_job_csv(
    path: str | Path, required: Sequence[str], submit_column: str, team: str
) -> tuple[list[JobSpec], ReadReport]:
    """Whole-GPU training jobs from a CSV with job_id, num_gpu, duration and a submit column.

    Shared by the ITP and the Philly-derived ElasticFlow lists, so both skip rows alike.
    """
    report = ReadReport(str(path))
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for line, row in open_rows(path, required):
        report.rows += 1
        job_id = row["job_id"].strip()
        if not job_id:
            raise TraceFormatError(path, line, "empty job_id")
        gpus = int_field(row, "num_gpu", path, line)
        submit = float_field(row, submit_column, path, line)
        duration = float_field(row, "duration", path, line)
        job = training_job(report, seen, job_id, gpus, submit, duration, team)
        if job is not None:
            jobs.append(job)
    jobs.sort(key=lambda j: j.submit_s)  # stable: ties keep file order
    return jobs, report


def itp_cluster_files(path: str | Path, fmt: str = "raw") -> list[Path]:
    """The per-cluster files to replay; other lists such as 195job.csv are a different workload.

    A directory without cluster files is searched one level down in the folder named for
    `fmt` (raw-traces or elasticflow-traces), so the trace root works too.
    """
    _check_format(fmt)
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise NotFoundError(
            f"ITP trace path {p} does not exist; pass a clusterNN.csv or its folder"
        )
    for folder in (p, p / FORMAT_FOLDERS[fmt]):
        if folder.is_dir():
            found = sorted(
                (f for f in folder.iterdir() if f.is_file() and _CLUSTER_FILE.fullmatch(f.name)),
                key=lambda f: f.name,
            )
            if found:
                return found
    raise NotFoundError(
        f"no clusterNN.csv files in {p} or {p / FORMAT_FOLDERS[fmt]}; "
        f"expected the ITP {fmt} trace files (cluster01.csv ... cluster10.csv)"
    )
