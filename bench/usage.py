"""The command line of a benchmark that takes no options: `--help` prints what it measures
and where it writes (its docstring) instead of starting a run of minutes."""

from __future__ import annotations

import argparse


def no_options(doc: str | None, argv: list[str] | None = None) -> None:
    """Parse argv (default sys.argv[1:]): -h/--help prints `doc` and exits 0; anything
    else exits 2 with the usage."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args(argv)
