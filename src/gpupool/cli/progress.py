"""A small progress bar on stderr for long runs; silent when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, stream: TextIO | None = None, force: bool = False) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = force or self.stream.isatty()
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        width = 30
        filled = int(width * done / total)
        elapsed = time.perf_counter() - self.started
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done >= total else ""
        pct = 100 * done / total
        self.stream.write(
            f"\r{self.label:<24} [{bar}] {pct:5.1f}% {done}/{total} {elapsed:6.1f}s{end}"
        )
        self.stream.flush()
