"""The GPU catalogue: what each GPU type can hold, how fast it moves data, and what it costs.

The packaged table (`data/gpu_catalog.csv`) is built from `shared/reference/gpu-catalog.csv`
and facts.md §1 and §5; every row names its sources. Prices move, so an operator CSV may
override any column of a known GPU or add a GPU (`load_catalog(override=...)`).
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpupool.errors import NotFoundError, SpecError

INTERCONNECT_CLASSES = ("nvswitch", "nvlink-bridge", "pcie-p2p", "pcie-host", "xgmi")

#: Columns that must be numbers.
NUMERIC_COLUMNS = (
    "memory_gib",
    "mem_bw_gb_s",
    "bf16_tflops",
    "fp32_tflops",
    "tdp_w",
    "gpu_gpu_bw_gb_s",
    "allreduce_busbw_gb_s",
    "price_usd_per_hour",
)
#: Zero allowed (no direct GPU link; a free GPU); everything else must be > 0.
_ZERO_OK = {"gpu_gpu_bw_gb_s", "price_usd_per_hour"}
TEXT_COLUMNS = ("label", "interconnect_class", "source", "notes")
COLUMNS = ("gpu", *TEXT_COLUMNS[:2], *NUMERIC_COLUMNS, *TEXT_COLUMNS[2:])

#: Other spellings people use for the same GPU (normalised: lower case, '-' separators).
ALIASES: dict[str, str] = {
    "h100-sxm": "H100",
    "h100-sxm5": "H100",
    "h100-80gb": "H100",
    "h100-sxm5-80gb": "H100",
    "h200-sxm": "H200",
    "h200-141gb": "H200",
    "b200-hgx": "B200",
    "a100-sxm4-40gb": "A100-40GB",
    "a100-40gb-sxm4": "A100-40GB",
    "a100-sxm4-80gb": "A100-80GB",
    "a100-80gb-sxm4": "A100-80GB",
    "a100-pcie-40gb": "A100-40GB-PCIe",
    "a100-pcie-80gb": "A100-80GB-PCIe",
    "4090": "RTX-4090",
    "3090": "RTX-3090",
    "geforce-rtx-4090": "RTX-4090",
    "geforce-rtx-3090": "RTX-3090",
    "mi300": "MI300X",
}


def normalise(name: str) -> str:
    """Lower case, runs of spaces and punctuation as one '-': 'H100 SXM5' -> 'h100-sxm5'."""
    return re.sub(r"[^a-z0-9.]+", "-", name.strip().lower()).strip("-")


@dataclass(frozen=True)
class GpuType:
    """One GPU type as the planner sees it. Rates are dense peak figures from the datasheet."""

    name: str
    label: str
    memory_gib: float
    mem_bw_gb_s: float
    bf16_tflops: float
    fp32_tflops: float
    tdp_w: float
    interconnect_class: str
    gpu_gpu_bw_gb_s: float
    allreduce_busbw_gb_s: float
    price_usd_per_hour: float
    source: str
    notes: str = ""


class Catalog:
    """GPU types in file order, looked up by name or any alias (case does not matter)."""

    def __init__(self, gpus: list[GpuType]) -> None:
        self._gpus: dict[str, GpuType] = {}
        self._keys: dict[str, str] = {}
        for gpu in gpus:
            self._gpus[gpu.name] = gpu
        self._index()

    def _index(self) -> None:
        self._keys.clear()
        for alias, target in ALIASES.items():
            if target in self._gpus:
                self._keys[alias] = target
        for gpu in self._gpus.values():
            self._keys[normalise(gpu.label)] = gpu.name
        for gpu in self._gpus.values():  # exact names win over labels and aliases
            self._keys[normalise(gpu.name)] = gpu.name

    def resolve(self, name: str) -> str:
        """The catalogue name for `name`, or NotFoundError listing the known ones."""
        if name in self._gpus:
            return name
        key = self._keys.get(normalise(name))
        if key is None:
            raise NotFoundError(
                f"unknown GPU {name!r}; known GPUs: {', '.join(self.names())} "
                "(add it with an operator catalogue CSV, --catalog FILE)"
            )
        return key

    def __getitem__(self, name: str) -> GpuType:
        return self._gpus[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._gpus or normalise(name) in self._keys)

    def __iter__(self) -> Iterator[GpuType]:
        return iter(self._gpus.values())

    def __len__(self) -> int:
        return len(self._gpus)

    def names(self) -> list[str]:
        return list(self._gpus)


def packaged_catalog_path() -> Path:
    return Path(str(resources.files("gpupool") / "data" / "gpu_catalog.csv"))


@functools.lru_cache(maxsize=1)
def _packaged() -> Catalog:
    return Catalog(_read(packaged_catalog_path(), base=None))


def load_catalog(override: str | Path | None = None) -> Catalog:
    """The packaged catalogue, with an operator CSV laid over it when given.

    Override rows name a `gpu`; for a known GPU (any alias) the non-empty cells replace the
    packaged values and empty or missing columns keep them. A new GPU must give every
    numeric column; its interconnect class defaults to the most pessimistic, pcie-host.
    """
    base = _packaged()
    if override is None:
        return base
    return Catalog(_read(Path(override), base=base))


def _read(path: Path, base: Catalog | None) -> list[GpuType]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise NotFoundError(f"catalogue file {path} does not exist; check the path") from None
    except OSError as exc:
        raise SpecError(f"cannot read catalogue file {path}: {exc.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    if "gpu" not in header:
        raise SpecError(
            f"{path}:1: the header needs a 'gpu' column; columns are {', '.join(COLUMNS)}"
        )
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise SpecError(
            f"{path}:1: unknown column(s) {', '.join(unknown)}; allowed: {', '.join(COLUMNS)}"
        )
    reader.fieldnames = header
    gpus: dict[str, GpuType] = {g.name: g for g in base} if base is not None else {}
    seen: set[str] = set()
    for row in reader:
        line = reader.line_num
        cells = {k: (v or "").strip() for k, v in row.items() if k is not None}
        if None in row:
            raise SpecError(f"{path}:{line}: more cells than header columns; quote commas")
        name = cells.get("gpu", "")
        if not name:
            raise SpecError(f"{path}:{line}: empty 'gpu' cell; give the GPU's short name")
        existing: str | None = None
        if base is not None and name in base:
            existing = base.resolve(name)
        key = existing or name
        if key in seen:
            raise SpecError(f"{path}:{line}: GPU {name!r} appears twice; keep one row")
        seen.add(key)
        values = {k: v for k, v in cells.items() if v != "" and k != "gpu"}
        parsed = _parse_values(path, line, values)
        if existing is not None:
            merged: dict[str, Any] = {**asdict(gpus[existing]), **parsed}
            gpus[existing] = GpuType(**merged)
            continue
        missing = [c for c in NUMERIC_COLUMNS if c not in parsed]
        if missing:
            what = "new GPU" if base is not None else "GPU"
            raise SpecError(
                f"{path}:{line}: {what} {name!r} lacks {', '.join(missing)}; "
                "a GPU not in the catalogue must give every numeric column"
            )
        if base is None:
            for col in ("label", "interconnect_class", "source"):
                if col not in parsed:
                    raise SpecError(f"{path}:{line}: GPU {name!r} lacks {col}")
        gpus[name] = GpuType(
            name=name,
            label=str(parsed.get("label", name)),
            interconnect_class=str(parsed.get("interconnect_class", "pcie-host")),
            source=str(parsed.get("source", f"operator catalogue {path.name}")),
            notes=str(parsed.get("notes", "")),
            **{c: float(parsed[c]) for c in NUMERIC_COLUMNS},
        )
    if not gpus:
        raise SpecError(f"{path}: no GPU rows; add one row per GPU under the header")
    return list(gpus.values())


def _parse_values(path: Path, line: int, values: dict[str, str]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for col, raw in values.items():
        if col in NUMERIC_COLUMNS:
            try:
                number = float(raw)
            except ValueError:
                raise SpecError(
                    f"{path}:{line}: {col} is {raw!r}, not a number; write it as a plain "
                    "number in the column's unit (e.g. 3350 for mem_bw_gb_s)"
                ) from None
            if number != number or number in (float("inf"), float("-inf")):
                raise SpecError(f"{path}:{line}: {col} must be a finite number, got {raw!r}")
            if number < 0 or (number == 0 and col not in _ZERO_OK):
                bound = ">= 0" if col in _ZERO_OK else "> 0"
                raise SpecError(f"{path}:{line}: {col} must be {bound}, got {raw!r}")
            out[col] = number
        elif col == "interconnect_class":
            if raw not in INTERCONNECT_CLASSES:
                raise SpecError(
                    f"{path}:{line}: interconnect_class {raw!r} is not one of "
                    f"{', '.join(INTERCONNECT_CLASSES)}"
                )
            out[col] = raw
        else:
            out[col] = raw
    return out
