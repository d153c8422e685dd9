"""Reading a YAML section the user wrote: one place that words the complaints alike.

Scenario files, tariffs and federation topologies all check their keys through a reader
bound to the file's path, so every error names the file, the key and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from gpupool.errors import SpecError


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
