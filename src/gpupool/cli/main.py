"""gpupool's command line: one parser, whose commands are built from the module that runs
them only when that command is asked for (cli/verbs.py lists them)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from gpupool import __version__
from gpupool.cli.verbs import GROUP_OF, GROUPS, HELP, CommandGroup
from gpupool.errors import GpupoolError


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `words` (the command line) one whose other commands are
    stand-ins that carry only their help line: `gpupool ls` does not import the simulator, and
    `gpupool --version` imports nothing of gpupool's commands."""
    parser = argparse.ArgumentParser(
        prog="gpupool",
        description="Pool GPUs and decide which job runs on which GPU, and when. "
        "`gpupool serve` runs the scheduler on this machine's GPUs; submit, ls, show, "
        "cancel, logs and top talk to it; plan sizes a job; simulate proves policies on "
        "real traces first.",
    )
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = None if words is None else _command_word(words)
    for group in GROUPS:
        if words is None or (wanted is not None and GROUP_OF.get(wanted) is group):
            _entry(group, group.add)(sub)
        else:
            for name, text in group.helps:
                sub.add_parser(name, help=text, add_help=False)
    return parser


def _command_word(words: Sequence[str]) -> str | None:
    """The command: the first word that is not an option (the top level's options, -h and
    --version, take no value)."""
    for word in words:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in HELP else None
    return None


def _entry(group: CommandGroup, name: str) -> Callable[..., Any]:
    return cast(Callable[..., Any], getattr(importlib.import_module(group.module), name))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] | None = None
    if words[:2] == ["service", "create"] and "--" in words:
        # the replica's command follows --, after the service's NAME positional
        cut = words.index("--")
        words, tail = words[:cut], words[cut + 1 :]
    args = build_parser(words).parse_args(words)
    if tail is not None:
        args.svc_argv = tail
    try:
        return int(_entry(GROUP_OF[args.command], GROUP_OF[args.command].run)(args))
    except GpupoolError as exc:
        print(f"gpupool: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpupool: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
