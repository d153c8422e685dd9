"""Electricity tariffs: price (and optionally grid carbon) by local hour and month.

A tariff is data (data/tariffs/*.yaml, or an operator's own file). The schema is in
docs/energy.md; every key is checked and a bad one is a SpecError naming file and key.
Scenario time t_s counts seconds from local midnight of day 0; day 0 is the first day of
`start_month` (1 January by default) of a 365-day year that repeats.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import yaml

from gpupool.energy.power import DEFAULT_PUE
from gpupool.errors import NotFoundError, SpecError
from gpupool.specfile import SpecReader

HOURS_PER_DAY: Final = 24
DAYS_PER_MONTH: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
HOURS_PER_YEAR: Final = 365 * HOURS_PER_DAY
CURRENCIES: Final = ("USD", "CNY")
_UNIT_DIVISOR: Final = {"per kWh": 1.0, "per MWh": 1000.0}
_FIRST_DAY: Final = tuple(sum(DAYS_PER_MONTH[:m]) for m in range(12))
_MONTH_OF_DAY: Final = np.repeat(np.arange(12), DAYS_PER_MONTH)

FloatArray = npt.NDArray[np.float64]


def _hour_index(t_s: float, utc_offset_h: float, start_month: int) -> tuple[int, float]:
    """(hour of the cyclic year, fraction into that hour) for scenario time t_s."""
    local_h = t_s / 3600.0 + utc_offset_h + _FIRST_DAY[start_month - 1] * HOURS_PER_DAY
    whole = math.floor(local_h)
    return whole, local_h - whole


@dataclass(frozen=True)
class Tariff:
    """Energy price per kWh by local hour; a month may have its own 24-hour profile."""

    name: str
    currency: str
    price_per_kwh: tuple[float, ...]
    """24 prices, local hours 0..23, for every month without its own row."""
    month_price_per_kwh: tuple[tuple[float, ...], ...] = ()
    """Empty, or 12 rows (January..December) of 24 prices each."""
    carbon_g_per_kwh: tuple[float, ...] | None = None
    """Grid carbon intensity by local hour (24 values), when known."""
    utc_offset_h: float = 0.0
    """Hours added to scenario time to get the tariff's local time (0: scenario is local)."""
    start_month: int = 1
    source: str = ""
    unit: str = "per kWh"
    derived: bool = False
    """True when the profile was built from published statistics, not copied from a rate."""
    _year: FloatArray = field(init=False, repr=False, compare=False)
    _cum: FloatArray = field(init=False, repr=False, compare=False)
    _steps_h: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"tariff {self.name}"
        if self.currency not in CURRENCIES:
            raise SpecError(f"{where}: currency must be one of {CURRENCIES}, got {self.currency!r}")
        if self.unit != "per kWh":
            raise SpecError(f"{where}: unit must be 'per kWh', got {self.unit!r}")
        _check_day(self.price_per_kwh, f"{where}: price_per_kwh")
        if self.month_price_per_kwh and len(self.month_price_per_kwh) != 12:
            raise SpecError(f"{where}: month_price_per_kwh needs 12 rows (January..December)")
        for m, row in enumerate(self.month_price_per_kwh):
            _check_day(row, f"{where}: month_price_per_kwh[{m}]")
        if self.carbon_g_per_kwh is not None:
            _check_day(self.carbon_g_per_kwh, f"{where}: carbon_g_per_kwh")
            if min(self.carbon_g_per_kwh) < 0:
                raise SpecError(f"{where}: carbon_g_per_kwh must be >= 0")
        if not 1 <= self.start_month <= 12:
            raise SpecError(f"{where}: start_month must be 1..12, got {self.start_month}")
        if not math.isfinite(self.utc_offset_h):
            raise SpecError(f"{where}: utc_offset_h must be a finite number of hours")
        rows = self.month_price_per_kwh or (self.price_per_kwh,) * 12
        year = np.asarray(rows, dtype=np.float64)[_MONTH_OF_DAY].reshape(-1)
        cum = np.concatenate(([0.0], np.cumsum(year)))
        # hours from each hour of the year to the next different price (cyclic); inf if none
        nxt = np.r_[year[1:], year[:1]] != year
        changes = np.flatnonzero(np.r_[nxt, nxt]) + 1
        if changes.size:
            idx = np.arange(HOURS_PER_YEAR)
            steps = changes[np.searchsorted(changes, idx + 1)] - idx
        else:
            steps = np.full(HOURS_PER_YEAR, np.inf)
        object.__setattr__(self, "_year", year)
        object.__setattr__(self, "_cum", cum)
        object.__setattr__(self, "_steps_h", steps.astype(np.float64))

    def _hour(self, t_s: float) -> tuple[int, float]:
        return _hour_index(t_s, self.utc_offset_h, self.start_month)

    def price_at(self, t_s: float) -> float:
        """Price per kWh at scenario time t_s."""
        return float(self._year[self._hour(t_s)[0] % HOURS_PER_YEAR])

    def prices_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """`price_at` for an array of times."""
        local_h = np.asarray(t_s, dtype=np.float64) / 3600.0 + self.utc_offset_h
        local_h += _FIRST_DAY[self.start_month - 1] * HOURS_PER_DAY
        out: FloatArray = self._year[np.floor(local_h).astype(np.int64) % HOURS_PER_YEAR]
        return out

    def carbon_at(self, t_s: float) -> float | None:
        """Grid carbon intensity (g CO2e/kWh) at t_s, or None when the tariff has none."""
        if self.carbon_g_per_kwh is None:
            return None
        return self.carbon_g_per_kwh[self._hour(t_s)[0] % HOURS_PER_DAY]

    def next_change_s(self, t_s: float) -> float:
        """The first hour boundary after t_s at which the price changes (inf: never)."""
        whole, _ = self._hour(t_s)
        steps = float(self._steps_h[whole % HOURS_PER_YEAR])
        if math.isinf(steps):
            return math.inf
        local_h = whole + steps - self.utc_offset_h
        return (local_h - _FIRST_DAY[self.start_month - 1] * HOURS_PER_DAY) * 3600.0

    def hourly(self, month: int) -> tuple[float, ...]:
        """The 24 prices of a calendar month (1..12)."""
        if not 1 <= month <= 12:
            raise SpecError(f"tariff {self.name}: month must be 1..12, got {month}")
        if self.month_price_per_kwh:
            return self.month_price_per_kwh[month - 1]
        return self.price_per_kwh

    def mean_price(self) -> float:
        """Time-weighted mean price over a whole year."""
        return float(self._year.mean())

    def _integral_h(self, t_s: float) -> float:
        """∫ price dh from the start of year 0 to t_s (price × hours)."""
        whole, frac = self._hour(t_s)
        years, hour = divmod(whole, HOURS_PER_YEAR)
        return float(years * self._cum[-1] + self._cum[hour] + frac * self._year[hour])

    def mean_price_between(self, start_s: float, end_s: float) -> float:
        """Time-weighted mean price over [start_s, end_s] (the price at start_s if empty)."""
        if end_s < start_s:
            raise SpecError(f"tariff {self.name}: end_s {end_s} is before start_s {start_s}")
        if end_s == start_s:
            return self.price_at(start_s)
        hours = (end_s - start_s) / 3600.0
        return (self._integral_h(end_s) - self._integral_h(start_s)) / hours

    def energy_cost(
        self, power_w: float, start_s: float, end_s: float, pue: float = DEFAULT_PUE
    ) -> float:
        """What drawing power_w (IT) from start_s to end_s costs, facility overhead included."""
        if power_w < 0 or pue < 1.0:
            raise SpecError(f"tariff {self.name}: need power_w >= 0 and pue >= 1")
        if end_s <= start_s:
            return 0.0
        integral_h = self._integral_h(end_s) - self._integral_h(start_s)
        return power_w / 1000.0 * pue * integral_h


def _check_day(values: Sequence[float], where: str) -> None:
    if len(values) != HOURS_PER_DAY:
        raise SpecError(f"{where}: needs {HOURS_PER_DAY} hourly values, got {len(values)}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise SpecError(f"{where}: every value must be a finite number, got {v!r}")


# ---- YAML ----------------------------------------------------------------------------------

_TOP_KEYS: Final = {
    "name",
    "currency",
    "unit",
    "source",
    "derived",
    "utc_offset_h",
    "start_month",
    "levels",
    "hours",
    "seasons",
    "carbon_g_per_kwh",
}


class _Reader(SpecReader):
    """Checks one tariff file; every problem names the file and the key."""

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise self.fail(where, f"{value} is not a finite number")
        return float(value)

    def hour_range(self, value: Any, where: str) -> list[int]:
        """'a-b' covers hours a..b-1 ('22-6' wraps past midnight); a bare hour covers one."""
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < HOURS_PER_DAY:
                raise self.fail(where, f"hour {value} is outside 0..23")
            return [value]
        parts = str(value).split("-")
        if not isinstance(value, str) or len(parts) != 2:
            raise self.fail(where, f"expected an hour range like '10-12', got {value!r}")
        try:
            a, b = int(parts[0]), int(parts[1])
        except ValueError:
            raise self.fail(where, f"expected an hour range like '10-12', got {value!r}") from None
        if not (0 <= a < HOURS_PER_DAY and 0 < b <= HOURS_PER_DAY) or a == b:
            raise self.fail(where, f"range {value!r} must run between hours 0 and 24, a != b")
        return list(range(a, b)) if a < b else [*range(a, HOURS_PER_DAY), *range(b)]

    def schedule(self, value: Any, where: str, levels: Mapping[str, float]) -> tuple[float, ...]:
        """24 prices from a list (numbers or level names) or a {level: [ranges]} mapping."""
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) != HOURS_PER_DAY:
                raise self.fail(where, f"needs 24 entries (hours 0..23), got {len(value)}")
            return tuple(self.price(v, f"{where}[{h}]", levels) for h, v in enumerate(value))
        if not isinstance(value, Mapping):
            raise self.fail(where, "expected a list of 24 prices or {level: [hour ranges]}")
        day: list[float | None] = [None] * HOURS_PER_DAY
        owner: dict[int, str] = {}
        for key, ranges in value.items():
            if key == "default":
                continue
            level = self.price(key, f"{where}.{key}", levels)
            items = ranges if isinstance(ranges, list) else [ranges]
            for k, item in enumerate(items):
                for h in self.hour_range(item, f"{where}.{key}[{k}]"):
                    if h in owner:
                        raise self.fail(f"{where}.{key}[{k}]", f"hour {h} is already {owner[h]!r}")
                    owner[h] = str(key)
                    day[h] = level
        if None in day:
            if "default" not in value:
                missing = [h for h, p in enumerate(day) if p is None]
                raise self.fail(where, f"hours {missing} have no price; add default: <level>")
            fill = self.price(value["default"], f"{where}.default", levels)
            day = [fill if p is None else p for p in day]
        return tuple(float(p) for p in day if p is not None)

    def price(self, value: Any, where: str, levels: Mapping[str, float]) -> float:
        if isinstance(value, str):
            if value not in levels:
                known = ", ".join(sorted(levels)) or "none defined"
                raise self.fail(where, f"unknown level {value!r} (levels: {known})")
            return levels[value]
        return self.number(value, where)


def parse_tariff(raw: Any, path: str = "<tariff>", default_name: str = "") -> Tariff:
    """A Tariff from the parsed YAML of one tariff file (schema: docs/energy.md)."""
    r = _Reader(path)
    if not isinstance(raw, Mapping):
        raise r.fail("top level", "expected a mapping (key: value)")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise r.fail(
            "top level",
            f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
            f"allowed: {', '.join(sorted(_TOP_KEYS))}",
        )
    for key in ("currency", "hours", "source"):
        if key not in raw:
            raise r.fail("top level", f"missing required key {key!r}")
    currency = raw["currency"]
    if currency not in CURRENCIES:
        raise r.fail("currency", f"must be one of {', '.join(CURRENCIES)}, got {currency!r}")
    unit = raw.get("unit", "per kWh")
    if unit not in _UNIT_DIVISOR:
        raise r.fail("unit", f"must be one of {', '.join(_UNIT_DIVISOR)}, got {unit!r}")
    divisor = _UNIT_DIVISOR[unit]
    raw_levels = raw.get("levels") or {}
    if not isinstance(raw_levels, Mapping):
        raise r.fail("levels", "expected {level name: price}")
    levels = {str(k): r.number(v, f"levels.{k}") for k, v in raw_levels.items()}
    if "default" in levels:
        raise r.fail("levels.default", "'default' is reserved for schedules")
    base = r.schedule(raw["hours"], "hours", levels)
    months: list[tuple[float, ...] | None] = [None] * 12
    seasons = raw.get("seasons") or []
    if not isinstance(seasons, list):
        raise r.fail("seasons", "expected a list of {name, months, hours}")
    for k, season in enumerate(seasons):
        where = f"seasons[{k}]"
        if not isinstance(season, Mapping):
            raise r.fail(where, "expected a mapping with months and hours")
        extra = set(season) - {"name", "months", "hours"}
        if extra:
            raise r.fail(where, f"unknown key(s) {', '.join(sorted(map(str, extra)))}")
        if "months" not in season or "hours" not in season:
            raise r.fail(where, "needs months and hours")
        day = r.schedule(season["hours"], f"{where}.hours", levels)
        ms = season["months"]
        if not isinstance(ms, list) or not ms:
            raise r.fail(f"{where}.months", "expected a list of months 1..12")
        for m in ms:
            if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 12:
                raise r.fail(f"{where}.months", f"{m!r} is not a month 1..12")
            if months[m - 1] is not None:
                raise r.fail(f"{where}.months", f"month {m} is already in another season")
            months[m - 1] = day
    carbon_raw = raw.get("carbon_g_per_kwh")
    carbon: tuple[float, ...] | None = None
    if carbon_raw is not None:
        carbon = r.schedule(carbon_raw, "carbon_g_per_kwh", {})
        if min(carbon) < 0:
            raise r.fail("carbon_g_per_kwh", "intensities must be >= 0")
    start_month = raw.get("start_month", 1)
    if isinstance(start_month, bool) or not isinstance(start_month, int):
        raise r.fail("start_month", f"expected a month 1..12, got {start_month!r}")
    if not 1 <= start_month <= 12:
        raise r.fail("start_month", f"{start_month} is not a month 1..12")
    derived = raw.get("derived", False)
    if not isinstance(derived, bool):
        raise r.fail("derived", f"expected true or false, got {derived!r}")
    source = raw["source"]
    if not isinstance(source, str) or not source.strip():
        raise r.fail("source", "say where the prices come from")

    def scaled(day: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(p / divisor for p in day)

    month_rows: tuple[tuple[float, ...], ...] = ()
    if any(m is not None for m in months):
        month_rows = tuple(scaled(base if m is None else m) for m in months)
    return Tariff(
        name=str(raw.get("name") or default_name or Path(path).stem),
        currency=str(currency),
        price_per_kwh=scaled(base),
        month_price_per_kwh=month_rows,
        carbon_g_per_kwh=carbon,
        utc_offset_h=r.number(raw.get("utc_offset_h", 0.0), "utc_offset_h"),
        start_month=start_month,
        source=" ".join(source.split()),
        derived=derived,
    )


@functools.lru_cache(maxsize=1)
def _per_usd() -> Mapping[str, float]:
    text = (resources.files("gpupool") / "data" / "currencies.csv").read_text("utf-8")
    return {row["currency"]: float(row["per_usd"]) for row in csv.DictReader(io.StringIO(text))}


def per_usd(currency: str) -> float:
    """Units of `currency` per US dollar (data/currencies.csv, an annual average): puts GPU
    time, priced in USD, on the same bill as electricity priced in the tariff's currency."""
    rates = _per_usd()
    if currency not in rates:
        raise NotFoundError(
            f"no exchange rate for {currency!r} in gpupool/data/currencies.csv "
            f"(known: {', '.join(sorted(rates))})"
        )
    return rates[currency]


def _shipped_dir() -> Any:
    return resources.files("gpupool") / "data" / "tariffs"


def shipped_tariffs() -> list[str]:
    """Names of the tariffs that ship with gpupool, sorted."""
    return sorted(
        p.name.removesuffix(".yaml") for p in _shipped_dir().iterdir() if p.name.endswith(".yaml")
    )


def load_tariff(name_or_path: str | Path) -> Tariff:
    """A shipped tariff by name (see `shipped_tariffs`) or a tariff YAML file by path."""
    text = str(name_or_path)
    path = Path(text)
    if isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        if not path.is_file():
            raise NotFoundError(f"tariff file {path} does not exist")
        return _parse_text(path.read_text(encoding="utf-8"), str(path), path.stem)
    names = shipped_tariffs()
    if text not in names:
        raise NotFoundError(
            f"no shipped tariff {text!r}; shipped: {', '.join(names)} (or give a YAML file path)"
        )
    body = (_shipped_dir() / f"{text}.yaml").read_text("utf-8")
    return _parse_text(body, f"gpupool/data/tariffs/{text}.yaml", text)


def _parse_text(text: str, path: str, default_name: str) -> Tariff:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_tariff(raw, path, default_name)


@dataclass(frozen=True)
class WallClockTariff(Tariff):
    """The same tariff read on the wall clock, for the live service: t_s is Unix time,
    priced at the tariff's own local hour (UTC + utc_offset_h) of the real calendar (29
    February is priced as the 28th). A scenario's time 0 is local midnight of 1 January
    1970, so a scenario and the live service read the same price at the same t_s."""

    def scenario_s(self, t_s: float) -> float:
        """Unix time as this tariff's scenario time (the base class's convention)."""
        tz = timezone(timedelta(hours=self.utc_offset_h))
        local = datetime.fromtimestamp(t_s, tz)
        day = local.timetuple().tm_yday - 1
        leap = local.year % 4 == 0 and (local.year % 100 != 0 or local.year % 400 == 0)
        if leap and day >= 59:
            day -= 1
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        into_day = (local - midnight).total_seconds()
        first = _FIRST_DAY[self.start_month - 1]
        return ((day - first) % 365) * 86_400.0 + into_day - self.utc_offset_h * 3600.0

    def _hour(self, t_s: float) -> tuple[int, float]:
        return super()._hour(self.scenario_s(t_s))

    def prices_at(self, t_s: npt.ArrayLike) -> FloatArray:
        times = np.atleast_1d(np.asarray(t_s, dtype=np.float64))
        return super().prices_at([self.scenario_s(float(t)) for t in times])

    def next_change_s(self, t_s: float) -> float:
        here = self.scenario_s(t_s)
        return t_s + (super().next_change_s(here) - here)


def on_wall_clock(tariff: Tariff) -> WallClockTariff:
    """`tariff`, read on Unix time (see WallClockTariff)."""
    values = {f.name: getattr(tariff, f.name) for f in fields(tariff) if f.init}
    return WallClockTariff(**values)
