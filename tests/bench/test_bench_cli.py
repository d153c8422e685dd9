"""Every benchmark script answers --help with what it measures instead of starting a run
of minutes: it parses its command line (argparse, `usage.no_options`, or its own --help)."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
PARSES = ("ArgumentParser", "no_options(", '"--help"')


def test_every_benchmark_script_parses_its_command_line() -> None:
    scripts = [p for p in sorted(BENCH.glob("*.py")) if '__name__ == "__main__"' in p.read_text()]
    assert len(scripts) >= 20
    silent = [p.name for p in scripts if not any(k in p.read_text() for k in PARSES)]
    assert not silent, f"these run on --help instead of explaining themselves: {silent}"
