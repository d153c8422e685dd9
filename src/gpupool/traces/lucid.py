"""The Lucid co-location measurements (Hu et al., ASPLOS '23): solo profiles of training
jobs and the measured speed of each job when two share one GPU (RTX 3090).

`single_data.csv`: model, dataset, batchsize, amp, speed (samples/s alone), gpu_util,
gmem_util, gmem (MiB), label. `colocate_info.csv`: an index column, then per job model,
dataset, gpu_num, batchsize, amp, speed (together over alone), then the pair's gpu_util,
gmem_util and gmem. Non-commercial licence: read from the shared traces folder at run
time (`LUCID_DIR` under `find_traces_dir()`), never copied into the project.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupool.errors import NotFoundError, TraceFormatError
from gpupool.traces.common import float_field, int_field, open_rows

LUCID_DIR = "lucid-colocation"
SOLO_FILE = "single_data.csv"
PAIRS_FILE = "colocate_info.csv"
SOLO_COLUMNS = ("model", "dataset", "batchsize", "amp", "speed", "gpu_util", "gmem_util", "gmem")
JOB_FIELDS = ("model", "dataset", "gpu_num", "batchsize", "amp", "speed")
PAIR_COLUMNS = tuple(f"{c}{i}" for i in (1, 2) for c in JOB_FIELDS)


@dataclass(frozen=True)
class SoloProfile:
    """What a scheduler can know of a job before it shares a card: its run alone."""

    model: str
    dataset: str
    batch_size: int
    amp: bool
    samples_per_s: float | None
    """Its throughput alone; None where the profile gives none (a job profiles CSV)."""
    sm_util_pct: float
    mem_bw_util_pct: float
    mem_mib: float
    name: str = ""
    """The job name it was profiled under (traces/job_profiles.py); empty for Lucid's."""

    @property
    def key(self) -> str:
        """The name a job carries to be looked up (`JobSpec.name`)."""
        return self.name or profile_key(self.model, self.dataset, self.batch_size, self.amp)


def profile_key(model: str, dataset: str, batch_size: int, amp: bool) -> str:
    return f"{model}/{dataset}/bs{batch_size}/{'amp' if amp else 'fp32'}"


@dataclass(frozen=True)
class PairMeasurement:
    """Two jobs run together on one GPU: each one's throughput over its throughput alone."""

    first: str
    """Profile key of the first job."""
    second: str
    first_speed: float
    second_speed: float

    @property
    def models(self) -> tuple[str, str]:
        """The unordered pair of models (the unit held out in leave-one-model-pair-out)."""
        a, b = self.first.split("/", 1)[0], self.second.split("/", 1)[0]
        return (a, b) if a <= b else (b, a)

    @property
    def min_speed(self) -> float:
        return min(self.first_speed, self.second_speed)


@dataclass(frozen=True)
class LucidData:
    profiles: dict[str, SoloProfile]
    pairs: tuple[PairMeasurement, ...]


def _amp(row: dict[str, str], name: str, path: Path, line: int) -> bool:
    value = int_field(row, name, path, line)
    if value not in (0, 1):
        raise TraceFormatError(path, line, f"{name}={value} must be 0 or 1")
    return value == 1


def _percent(row: dict[str, str], name: str, path: Path, line: int) -> float:
    value = float_field(row, name, path, line)
    if not 0.0 <= value <= 100.0:
        raise TraceFormatError(path, line, f"{name}={value} is not a percentage (0-100)")
    return value


def read_solo(path: str | Path) -> dict[str, SoloProfile]:
    """Solo profiles by key; a duplicate key or an out-of-range value is an error."""
    p = Path(path)
    out: dict[str, SoloProfile] = {}
    for line, row in open_rows(p, SOLO_COLUMNS):
        batch = int_field(row, "batchsize", p, line)
        samples = float_field(row, "speed", p, line)
        mem = float_field(row, "gmem", p, line)
        if batch <= 0 or samples <= 0 or mem < 0:
            raise TraceFormatError(p, line, "batchsize and speed must be > 0, gmem >= 0")
        prof = SoloProfile(
            model=row["model"].strip(),
            dataset=row["dataset"].strip(),
            batch_size=batch,
            amp=_amp(row, "amp", p, line),
            samples_per_s=samples,
            sm_util_pct=_percent(row, "gpu_util", p, line),
            mem_bw_util_pct=_percent(row, "gmem_util", p, line),
            mem_mib=mem,
        )
        if not prof.model:
            raise TraceFormatError(p, line, "empty model name")
        if prof.key in out:
            raise TraceFormatError(p, line, f"second solo profile for {prof.key}")
        out[prof.key] = prof
    return out


def read_pairs(path: str | Path, profiles: dict[str, SoloProfile]) -> tuple[PairMeasurement, ...]:
    """Measured pairs; each job must have a solo profile (else its line is named)."""
    p = Path(path)
    out: list[PairMeasurement] = []
    for line, row in open_rows(p, PAIR_COLUMNS):
        keys: list[str] = []
        speeds: list[float] = []
        for i in (1, 2):
            key = profile_key(
                row[f"model{i}"].strip(),
                row[f"dataset{i}"].strip(),
                int_field(row, f"batchsize{i}", p, line),
                _amp(row, f"amp{i}", p, line),
            )
            if key not in profiles:
                raise TraceFormatError(p, line, f"job {i} ({key}) has no solo profile")
            if int_field(row, f"gpu_num{i}", p, line) != 1:
                raise TraceFormatError(p, line, f"gpu_num{i} must be 1 (one shared GPU)")
            speed = float_field(row, f"speed{i}", p, line)
            if not 0.0 < speed <= 3.0:
                raise TraceFormatError(p, line, f"speed{i}={speed} is not a relative speed")
            keys.append(key)
            speeds.append(speed)
        out.append(PairMeasurement(keys[0], keys[1], speeds[0], speeds[1]))
    return tuple(out)


def read_lucid(folder: str | Path) -> LucidData:
    """Both files of the Lucid folder (…/shared/traces/lucid-colocation)."""
    d = Path(folder)
    if not d.is_dir():
        raise NotFoundError(f"Lucid co-location folder {d} does not exist; set GPUPOOL_TRACES")
    profiles = read_solo(d / SOLO_FILE)
    return LucidData(profiles, read_pairs(d / PAIRS_FILE, profiles))
