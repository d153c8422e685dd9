"""The links a gang's all-reduce runs over, and their measured bus bandwidth.

The packaged table (`data/interconnect_links.csv`) names its sources per row; the
`topology: links:` setting names a row or gives a number of GB/s of its own.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources
from pathlib import Path

from gpupool.errors import SpecError


@functools.cache
def load_links() -> dict[str, float]:
    """Link name -> all-reduce bus bandwidth in GB/s."""
    path = Path(str(resources.files("gpupool") / "data" / "interconnect_links.csv"))
    with path.open(newline="", encoding="utf-8") as f:
        return {row["link"]: float(row["busbw_gb_s"]) for row in csv.DictReader(f)}


def link_busbw_gb_s(value: object, where: str) -> float:
    """A link by name (a row of the table) or a bandwidth in GB/s."""
    links = load_links()
    if isinstance(value, str) and value in links:
        return links[value]
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise SpecError(
        f"{where}: {value!r} is not a link; name one of {', '.join(sorted(links))} "
        "or give its all-reduce bus bandwidth in GB/s"
    )
