"""The public trace files the generators draw from, and their parsed
contents (cached: a scenario's entries often read the same file)."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.errors import SpecError
from gpupool.sim.scenario.generators.params import GenContext
from gpupool.traces.azure_llm import RequestArrival, arrival_rate_per_s, read_azure_llm
from gpupool.traces.itp import read_itp
from gpupool.traces.location import TRACES_ENV

PHILLY_RUNTIME = Path("philly") / "philly_runtime.csv"
AZURE_DIR = Path("azure-llm-inference-2023")
AZURE_FILES = {
    "code": "AzureLLMInferenceTrace_code.csv",
    "conv": "AzureLLMInferenceTrace_conv.csv",
}
ITP_RAW_DIR = Path("microsoft-itp-2021") / "raw-traces"

PHILLY_MEDIAN_S = 1186.0
PHILLY_MEAN_S = 14_613.0
"""Published summary of philly_runtime.csv, for the lognormal fallback."""


def trace_file(ctx: GenContext, generator: str, relative: Path) -> Path:
    """The trace file a generator needs, or a SpecError saying how to provide it."""
    if ctx.traces_dir is None:
        raise SpecError(
            f"generator {generator!r} needs the trace file <traces>/{relative.as_posix()}, but no "
            f"traces folder was found; set {TRACES_ENV} to the folder holding the public traces "
            "(…/shared/traces)"
        )
    path = ctx.traces_dir / relative
    if not path.is_file():
        raise SpecError(
            f"generator {generator!r} needs the trace file {path}, which does not exist; "
            f"set {TRACES_ENV} to the folder holding the public traces (…/shared/traces)"
        )
    return path


@lru_cache(maxsize=4)
def philly_runtimes(path: Path) -> np.ndarray:
    values: list[float] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if "runtime" not in header:
            raise SpecError(f"{path}: expected a 'runtime' column, header is {header}")
        col = header.index("runtime")
        for row in reader:
            if not row:
                continue
            try:
                x = float(row[col])
            except (ValueError, IndexError):
                raise SpecError(f"{path}:{reader.line_num}: runtime is not a number") from None
            if not (math.isfinite(x) and x >= 0):
                raise SpecError(f"{path}:{reader.line_num}: runtime must be >= 0, got {x}")
            values.append(x)
    if not values:
        raise SpecError(f"{path}: no runtimes")
    out = np.array(values)
    out.flags.writeable = False
    return out


def lognormal_params(median_s: float, mean_s: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and mean: median = e^mu and
    mean = e^(mu + sigma^2/2), so sigma = sqrt(2 ln(mean/median))."""
    if not 0 < median_s <= mean_s:
        raise SpecError("a lognormal needs 0 < median <= mean")
    return math.log(median_s), math.sqrt(2.0 * math.log(mean_s / median_s))


@lru_cache(maxsize=4)
def itp_jobs(path: Path) -> tuple[JobSpec, ...]:
    jobs, _ = read_itp(path, "raw")
    return tuple(jobs)


def _first_stamp_s(path: Path) -> float:
    """Wall time of a trace file's first row, in seconds: read_azure_llm counts from it."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        row = next(reader, None)
    text = (row or {}).get("TIMESTAMP") or ""
    match = re.fullmatch(r"\s*(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(\.\d+)?\s*", text)
    if not match:
        raise SpecError(f"{path}: first TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.f]'")
    whole = datetime.strptime(match.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    return (whole - datetime(1970, 1, 1)).total_seconds() + float(match.group(2) or 0.0)


@lru_cache(maxsize=4)
def azure_minute_shape(paths: tuple[Path, ...]) -> tuple[float, ...]:
    """Per-minute arrival rate of the Azure LLM files, over the whole minutes in which all of
    them were recording, normalised to mean 1."""
    starts = [_first_stamp_s(p) for p in paths]
    origin = max(starts)
    merged: list[RequestArrival] = []
    end = math.inf
    for path, start in zip(paths, starts, strict=True):
        arrivals, _ = read_azure_llm(path)
        if not arrivals:
            raise SpecError(f"{path}: no requests")
        end = min(end, start + arrivals[-1].arrival_s)
        shift = start - origin
        merged += [
            replace(a, arrival_s=a.arrival_s + shift) for a in arrivals if a.arrival_s + shift >= 0
        ]
    merged.sort(key=lambda a: a.arrival_s)
    minutes = int((end - origin) // 60.0)
    rates = arrival_rate_per_s(merged, 60.0)[:minutes]
    mean = sum(rates) / len(rates) if rates else 0.0
    if mean <= 0:
        raise SpecError(f"Azure trace files {', '.join(map(str, paths))} overlap by no minute")
    return tuple(r / mean for r in rates)
