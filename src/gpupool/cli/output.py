"""The one rule for what a command prints: with --json the server's JSON, else text.

Every command that answers with a document calls emit() instead of repeating the branch; the
text is a function so that it is made only when it is printed (it may read fields a JSON
reader does not need).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def print_json(payload: object) -> None:
    """The payload as the server sent it, indented: what --json prints."""
    print(json.dumps(payload, indent=2))


def emit(args: argparse.Namespace, payload: object, text: Callable[[], str]) -> int:
    """Print `payload` as JSON when the command was given --json, else `text()`; the
    command's exit code (0)."""
    if args.json:
        print_json(payload)
    else:
        print(text())
    return 0
