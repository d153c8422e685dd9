"""Solo profiles of the jobs a cluster runs, by job name: what the co-location admission
(`sharing.admission`) looks a sharing job up by (`JobSpec.name`).

A CSV with a header and the columns `name,sm_util_pct,mem_bw_util_pct,mem_mib` (others
are ignored): each job's SM and memory-bandwidth utilisation in percent and its memory in
MiB when it ran alone on one GPU, as `nvidia-smi` or DCGM reports them. These are the
features the predictor was trained on (Lucid's gpu_util, gmem_util, gmem), so a profile
measured on a different GPU model than the training pairs' (RTX 3090) is an extrapolation.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.errors import TraceFormatError
from gpupool.traces.common import float_field, open_rows
from gpupool.traces.lucid import SoloProfile

PROFILE_COLUMNS = ("name", "sm_util_pct", "mem_bw_util_pct", "mem_mib")


def read_job_profiles(path: str | Path) -> dict[str, SoloProfile]:
    """Profiles by job name; a missing column, a bad or out-of-range number or a second
    row for one name is an error naming the file and the line."""
    p = Path(path)
    out: dict[str, SoloProfile] = {}
    for line, row in open_rows(p, PROFILE_COLUMNS):
        name = row["name"].strip()
        if not name:
            raise TraceFormatError(p, line, "empty job name")
        if name in out:
            raise TraceFormatError(p, line, f"second profile for job name {name!r}")
        util = {}
        for col in ("sm_util_pct", "mem_bw_util_pct"):
            util[col] = float_field(row, col, p, line)
            if not 0.0 <= util[col] <= 100.0:
                raise TraceFormatError(p, line, f"{col}={util[col]:g} is not a percentage (0-100)")
        mem = float_field(row, "mem_mib", p, line)
        if mem < 0:
            raise TraceFormatError(p, line, f"mem_mib={mem:g} must be >= 0")
        out[name] = SoloProfile(
            model=name,
            dataset="",
            batch_size=0,
            amp=False,
            samples_per_s=None,
            sm_util_pct=util["sm_util_pct"],
            mem_bw_util_pct=util["mem_bw_util_pct"],
            mem_mib=mem,
            name=name,
        )
    if not out:
        raise TraceFormatError(p, 1, "no profiles: expected one row per job name")
    return out
