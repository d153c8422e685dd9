"""Node labels: where each node of the live fleet sits in the network (`rack=r1`).

They come from three places, merged per node in this order (a later one wins per key):
the node itself (`gpupool node join --label`, carried as Ray resources), the fake fleet
(`--fake-gpus 2x8xA100-80GB@rack=r1`), and the `labels:` section of `--config`
(`labels: {n1: {rack: r1}}`), which can label any fleet by node name. The core reads
the keys named in `topology: levels:` (domain/topology.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError
from gpupool.specfile import config_section

SECTION = "labels"
"""The --config section: {node name: {label key: value}}."""

NodeLabels = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
"""(node name, its (key, value) labels sorted by key), per node."""


def check_label(key: str, value: str, where: str) -> None:
    """A key of letters, digits and -; a value of letters, digits, - and _ (both end up
    in a Ray resource name, `gpupool_label_<key>_<value>`)."""
    if not key or not all(c.isalnum() or c == "-" for c in key):
        raise SpecError(f"{where}: label key {key!r}: use letters, digits and - only")
    if not value or not all(c.isalnum() or c in "-_" for c in value):
        raise SpecError(f"{where}: label {key}={value!r}: use letters, digits, - and _ only")


def parse_labels_section(raw: Any, where: str) -> NodeLabels:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: labels: expected {{node name: {{key: value}}}}")
    out = []
    for node, labels in sorted(raw.items(), key=lambda kv: str(kv[0])):
        if not isinstance(labels, Mapping) or not labels:
            raise SpecError(f"{where}: labels: {node}: expected {{key: value}}, e.g. {{rack: r1}}")
        pairs = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        for k, v in pairs:
            check_label(k, v, f"{where}: labels: {node}")
        out.append((str(node), pairs))
    return tuple(out)


def load_labels(path: Path | None) -> NodeLabels:
    """The `labels:` section of the --config file (none when absent)."""
    return parse_labels_section(config_section(path, SECTION), str(path))


def merge_labels(*sources: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> NodeLabels:
    """Per node, the labels of every source, a later source winning per key."""
    merged: dict[str, dict[str, str]] = {}
    for source in sources:
        for node, pairs in source:
            merged.setdefault(node, {}).update(dict(pairs))
    return tuple((n, tuple(sorted(merged[n].items()))) for n in sorted(merged))
