"""How many missed telemetry answers make a node unreadable (`telemetry_miss_limit`).

A node's telemetry actor (`RayTelemetry`) may miss an answer now and then: a busy worker,
a slow GCS, a pause in the node's Python. Reading its GPUs as lost at the first miss
drains every GPU of the node and evicts all its jobs for a hiccup. `MissCounter` keeps the
node's last good answer and hands it out again while the misses in a row stay under the
limit; at the limit the node reads as lost (None), and one answer starts the count over.

Pure: it is fed answers and misses and reads no clock; `load_miss_limit` reads the
top-level `telemetry_miss_limit:` key of `gpupool serve --config FILE`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpupool.errors import SpecError
from gpupool.ports.telemetry.base import GpuSample
from gpupool.specfile import config_section

KEY: Final = "telemetry_miss_limit"
"""The --config file's top-level key (beside the scheduling keys)."""
DEFAULT_MISS_LIMIT: Final = 3
"""Missed answers in a row before a node's GPUs read as lost."""


@dataclass
class MissCounter:
    """One node's missed answers in a row and its last good answer."""

    limit: int = DEFAULT_MISS_LIMIT
    misses: int = 0
    """Rounds in a row the node has not answered."""
    last: tuple[GpuSample, ...] | None = None
    """The node's last answer (None before its first one)."""

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise SpecError(f"{KEY} must be at least 1, got {self.limit}")

    def answered(self, samples: Sequence[GpuSample]) -> list[GpuSample]:
        """The node answered: its samples are the reading, and the count starts over."""
        self.misses = 0
        self.last = tuple(samples)
        return list(samples)

    def missed(self, now_s: float) -> list[GpuSample] | None:
        """The node did not answer this round: its last answer, stamped `now_s` (what
        reads samples in time order takes them as this round's; their values are the last
        reading's), while the misses in a row stay under the limit; None once they reach it,
        or when the node never answered."""
        self.misses += 1
        if self.last is None or self.misses >= self.limit:
            return None
        return [dataclasses.replace(s, at_s=now_s) for s in self.last]


def parse_miss_limit(value: Any, path: str) -> int:
    """The value of `telemetry_miss_limit:` (None: the default), checked."""
    if value is None:
        return DEFAULT_MISS_LIMIT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(
            f"{path}: {KEY} must be a whole number of missed telemetry answers, 1 or more "
            f"(1 drains a node at its first missed answer; default {DEFAULT_MISS_LIMIT}), "
            f"got {value!r}"
        )
    return value


def load_miss_limit(path: Path | None) -> int:
    """The --config file's `telemetry_miss_limit:` (the default when absent)."""
    return parse_miss_limit(config_section(path, KEY), str(path))
