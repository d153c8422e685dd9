"""Job lists derived from the Microsoft Philly trace (the raw trace is not public in full).

Pollux's list of all VCs (`philly-pollux/philly.csv`): timestamp,duration,num_gpus,gpu_time,
cluster, one job a row, not sorted. ElasticFlow's VC 103959 list: job_id,submit_time,
real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,duration,iteration. Gavel's
old msr traces: 7 tab-separated fields, no header: job_type, command, num_steps_arg,
needs_data_dir, total_steps, arrival_time, scale_factor.

Gavel wrote each msr job's total_steps as int(Philly run time in seconds x the job type's
isolated single-GPU V100 throughput), whatever the job's GPU count; `data/gavel_throughputs.csv`
holds those throughputs (source in data/SOURCES.md), so the run time comes back as
total_steps / throughput.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Mapping
from pathlib import Path

from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec
from gpupool.errors import NotFoundError, TraceFormatError
from gpupool.traces.common import ReadReport, float_field, int_field, open_rows
from gpupool.traces.itp import read_gpu_job_csv, training_job

ELASTICFLOW_COLUMNS = (
    "job_id",
    "submit_time",
    "real_iteration",
    "model_name",
    "ddl",
    "batch_size",
    "num_gpu",
    "real_duration",
    "duration",
    "iteration",
)
GAVEL_MSR_FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time",
    "scale_factor",
)

_PHILLY_VC = re.compile(r"philly_(\w+)")


def _philly_team(path: Path) -> str:
    """ElasticFlow names the file after the VC; a team per VC keeps merged lists apart."""
    match = _PHILLY_VC.search(path.stem)
    return f"philly-{match.group(1)}" if match else path.stem


def read_elasticflow_philly(
    path: str | Path, team: str | None = None
) -> tuple[list[JobSpec], ReadReport]:
    """Use the `duration` column, the one ElasticFlow's simulator replays."""
    team_name = team if team is not None else _philly_team(Path(path))
    return read_gpu_job_csv(path, ELASTICFLOW_COLUMNS, "submit_time", team_name)


def gavel_vc(path: Path) -> str:
    """'103959.trace.txt' -> '103959': the VC name, without either suffix."""
    name = path.name
    for suffix in (".txt", ".trace"):
        name = name.removesuffix(suffix)
    return name or path.stem


GAVEL_THROUGHPUT_COLUMNS = ("job_type", "gpu_type", "steps_per_s")


def packaged_gavel_throughputs_path() -> Path:
    from importlib import resources  # about 5 ms of imports that only Gavel traces need

    return Path(str(resources.files("gpupool") / "data" / "gavel_throughputs.csv"))


def read_gavel_throughputs(path: str | Path) -> dict[str, float]:
    """job_type -> steps per second, from a CSV with job_type,gpu_type,steps_per_s."""
    out: dict[str, float] = {}
    for line, row in open_rows(path, GAVEL_THROUGHPUT_COLUMNS):
        job_type = row["job_type"].strip()
        if not job_type:
            raise TraceFormatError(path, line, "empty job_type; name the Gavel model")
        if job_type in out:
            raise TraceFormatError(
                path, line, f"job_type {job_type!r} is listed twice; keep one throughput per type"
            )
        rate = float_field(row, "steps_per_s", path, line)
        if rate <= 0:
            raise TraceFormatError(
                path, line, f"steps_per_s={rate} for {job_type!r}; a throughput must be > 0"
            )
        out[job_type] = rate
    if not out:
        raise TraceFormatError(path, 2, "no throughput rows; list one row per Gavel job type")
    return out


@functools.lru_cache(maxsize=1)
def gavel_throughputs() -> Mapping[str, float]:
    """The packaged isolated V100 throughputs Gavel used to write the msr traces' steps."""
    return read_gavel_throughputs(packaged_gavel_throughputs_path())


def read_gavel_msr(
    path: str | Path, throughputs: Mapping[str, float] | None = None
) -> tuple[list[JobSpec], ReadReport]:
    """Read one per-VC Gavel msr trace; duration_s = total_steps / the job type's throughput.

    `throughputs` maps job_type to steps per second (default: the packaged V100 table Gavel
    derived the steps with). A job type missing from it is an error, never a guessed duration.
    """
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"trace file {p} does not exist; check the path")
    rates = gavel_throughputs() if throughputs is None else throughputs
    vc = gavel_vc(p)
    report = ReadReport(str(path))
    jobs: list[JobSpec] = []
    with p.open(newline="", encoding="utf-8") as handle:
        # QUOTE_NONE: the command field is shell text, and a stray quote must not swallow tabs.
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(GAVEL_MSR_FIELDS):
                raise TraceFormatError(
                    path,
                    line,
                    f"expected {len(GAVEL_MSR_FIELDS)} tab-separated fields, found {len(values)}",
                )
            row = dict(zip(GAVEL_MSR_FIELDS, values, strict=True))
            index = report.rows
            report.rows += 1
            job_type = row["job_type"].strip()
            if not job_type:
                raise TraceFormatError(path, line, "empty job_type")
            rate = rates.get(job_type)
            if rate is None:
                raise TraceFormatError(
                    path,
                    line,
                    f"job_type {job_type!r} has no Gavel throughput, so its run time cannot be "
                    "recovered from total_steps; add it to the throughput table "
                    f"({len(rates)} known types, e.g. {min(rates)!r})",
                )
            int_field(row, "needs_data_dir", path, line)
            steps = int_field(row, "total_steps", path, line)
            arrival = float_field(row, "arrival_time", path, line)
            gpus = int_field(row, "scale_factor", path, line)
            if gpus <= 0:
                report.skip("no GPU requested")
                continue
            if steps <= 0:
                report.skip("non-positive step count")
                continue
            if arrival < 0:
                report.skip("negative submit time")
                continue
            jobs.append(
                JobSpec(
                    job_id=f"{vc}-{index}",
                    gpu_count=gpus,
                    gpu_milli=MILLI_PER_GPU,
                    team=vc,
                    kind=JobKind.TRAINING,
                    submit_s=arrival,
                    duration_s=steps / rate,
                    name=job_type,
                )
            )
            report.used += 1
    if report.rows == 0:
        raise TraceFormatError(path, 1, "empty file: expected tab-separated job rows")
    jobs.sort(key=lambda j: j.submit_s)  # stable: ties keep file order
    return jobs, report


POLLUX_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


def read_pollux_philly(path: str | Path) -> tuple[list[JobSpec], ReadReport]:
    """Pollux's Philly job list (timestamp,duration,num_gpus,gpu_time,cluster), sorted by time.

    The team is the job's virtual cluster. The file has no job id: a job is named by its
    line (`L<line>`), stable for the file. Its rows are not in time order; submit_s counts
    from midnight (UTC, as the timestamps are read: the trace does not state its zone) of
    the earliest day, which `report.origin_s` gives as Unix time.
    """
    from datetime import UTC, datetime  # only this reader parses dates

    report = ReadReport(str(path))
    rows: list[tuple[float, int, int, float, str]] = []
    for line, row in open_rows(path, POLLUX_COLUMNS):
        report.rows += 1
        try:
            at = datetime.fromisoformat(row["timestamp"].strip()).replace(tzinfo=UTC)
        except ValueError:
            raise TraceFormatError(
                path, line, f"timestamp {row['timestamp']!r} is not YYYY-MM-DD HH:MM:SS"
            ) from None
        team = row["cluster"].strip()
        if not team:
            raise TraceFormatError(path, line, "empty cluster: the job's team is its VC")
        gpus = int_field(row, "num_gpus", path, line)
        duration = float_field(row, "duration", path, line)
        rows.append((at.timestamp(), line, gpus, duration, team))
    if not rows:
        raise TraceFormatError(path, 2, "no jobs")
    first = min(r[0] for r in rows)
    report.origin_s = first - first % 86_400.0
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for at_s, line, gpus, duration, team in sorted(rows):  # by time, then by line
        job = training_job(report, seen, f"L{line}", gpus, at_s - report.origin_s, duration, team)
        if job is not None:
            jobs.append(job)
    return jobs, report
