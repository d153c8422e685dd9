"""The `sharing.admission:` section (learning/colocation_config.PairAdmissionConfig),
parsed apart from config_schema.py to keep that module within its size.

Pure: the profiles and pairs paths are resolved against the configuration file's folder
(an absolute path stays as it is) but not opened; the drivers read them at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.errors import SpecError
from gpupool.learning.colocation_admission import ColocationGuardConfig
from gpupool.learning.colocation_config import ADMISSION_MODES, DECIDERS, PairAdmissionConfig
from gpupool.specfile import SpecReader

ADMISSION_KEYS = frozenset(
    {"decider", "mode", "profiles", "pairs", "max_sum_sm_pct", "min_speed", "guard", "seed"}
)
GUARD_KEYS = frozenset({"window_pairs", "min_pairs", "max_slowed_share", "recover_margin"})
WHERE = "sharing.admission"


def parse_admission(r: SpecReader, raw: Any, d: PairAdmissionConfig) -> PairAdmissionConfig:
    """`sharing.admission` over `d`; every error names the key and what to write."""
    if raw is None:
        return d
    m = r.mapping(raw, WHERE, ADMISSION_KEYS)
    decider = str(m.get("decider", d.decider))
    if decider not in DECIDERS:
        raise r.fail(f"{WHERE}.decider", f"{decider!r}; choose one of {', '.join(DECIDERS)}")
    mode = str(m.get("mode", d.mode))
    if mode not in ADMISSION_MODES:
        raise r.fail(f"{WHERE}.mode", f"{mode!r}; choose {' or '.join(ADMISSION_MODES)}")
    if "mode" in m and decider != "learned":
        raise r.fail(f"{WHERE}.mode", "goes with decider: learned only; drop it or set decider")
    profiles = _path(r, m.get("profiles"), "profiles") if "profiles" in m else d.profiles
    pairs = _path(r, m.get("pairs"), "pairs") if "pairs" in m else d.pairs
    bound = m.get("max_sum_sm_pct", d.max_sum_sm_pct)
    if bound is not None:
        bound = _number(r, bound, "max_sum_sm_pct", 0.0, 200.0)
        if bound <= 0:
            raise r.fail(f"{WHERE}.max_sum_sm_pct", "give a bound above 0 (percent, up to 200)")
    min_speed = _number(r, m.get("min_speed", d.min_speed), "min_speed", 0.0, 1.0)
    seed = m.get("seed", d.seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise r.fail(f"{WHERE}.seed", f"{seed!r}; give a whole number >= 0")
    g = r.mapping({} if m.get("guard") is None else m["guard"], f"{WHERE}.guard", GUARD_KEYS)
    dg = d.guard
    try:
        guard = ColocationGuardConfig(
            window_pairs=_count(r, g.get("window_pairs", dg.window_pairs), "guard.window_pairs"),
            min_pairs=_count(r, g.get("min_pairs", dg.min_pairs), "guard.min_pairs"),
            max_slowed_share=_number(
                r, g.get("max_slowed_share", dg.max_slowed_share), "guard.max_slowed_share", 0, 1
            ),
            recover_margin=_number(
                r, g.get("recover_margin", dg.recover_margin), "guard.recover_margin", 0, 1
            ),
        )
        return PairAdmissionConfig(decider, mode, profiles, pairs, bound, min_speed, guard, seed)
    except SpecError as err:
        raise r.fail(WHERE, str(err)) from None


def _path(r: SpecReader, value: Any, key: str) -> str:
    """A path as written, against the configuration file's folder when relative."""
    if not isinstance(value, str) or not value.strip():
        raise r.fail(f"{WHERE}.{key}", f"{value!r}; give a file or folder path")
    given = Path(value.strip()).expanduser()
    return str(given if given.is_absolute() else Path(r.path).parent / given)


def _number(r: SpecReader, value: Any, key: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise r.fail(f"{WHERE}.{key}", f"expected a number, got {value!r}")
    if not low <= value <= high:
        raise r.fail(f"{WHERE}.{key}", f"{value:g} is out of range; give {low:g}..{high:g}")
    return float(value)


def _count(r: SpecReader, value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise r.fail(f"{WHERE}.{key}", f"{value!r}; give a whole number >= 1")
    return value
