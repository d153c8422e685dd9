"""Where the public traces live on this machine: one rule for the simulator and loadgen."""

from __future__ import annotations

import os
from pathlib import Path

TRACES_ENV = "GPUPOOL_TRACES"
"""The variable that names the public traces folder (…/shared/traces)."""


def find_traces_dir(start: Path | None = None) -> Path | None:
    """The public traces folder: $GPUPOOL_TRACES, else a `shared/traces` found walking up from
    `start` (default: the working directory) or from this file; None if there is none."""
    env = os.environ.get(TRACES_ENV)
    if env and Path(env).expanduser().is_dir():
        return Path(env).expanduser().resolve()
    origin = (start if start is not None else Path.cwd()).resolve()
    for base in (origin, Path(__file__).resolve().parent):
        for folder in (base, *base.parents):
            candidate = folder / "shared" / "traces"
            if candidate.is_dir():
                return candidate
    return None
