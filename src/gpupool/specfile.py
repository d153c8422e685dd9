"""Reading a YAML section the user wrote: one place that words the complaints alike.

Scenario files, tariffs and federation topologies all check their keys through a reader
bound to the file's path, so every error names the file, the key and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

import yaml

from gpupool.errors import SpecError


def config_section(path: Path | None, section: str) -> Any:
    """The `section:` of a `gpupool serve --config` file as YAML gave it; None where there
    is no file, no such section, or the file cannot be read or parsed (the service's own
    config loader reports what is wrong with the file, once)."""
    if path is None:
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return raw.get(section) if isinstance(raw, dict) else None


class SpecReader:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> SpecError:
        return SpecError(f"{self.path}: {where}: {problem}")

    def mapping(self, value: Any, where: str, allowed: Set[str]) -> Mapping[str, Any]:
        """A mapping with only the allowed keys (unknown ones are named, with the list)."""
        if not isinstance(value, Mapping):
            raise self.fail(where, "expected a mapping (key: value)")
        unknown = set(value) - set(allowed)
        if unknown:
            raise self.fail(
                where,
                f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"allowed: {', '.join(sorted(allowed))}",
            )
        return value
