"""Team quotas on one shared pool: guarantees, maxima, time-of-day windows, fair share.

A team's guarantee (per GPU type) is capacity it gets back, by preemption if need be,
whenever it has demand; above the guarantee it may borrow idle GPUs up to its maximum,
and borrowed GPUs are what reclaim preempts. Time windows replace guarantees and maxima
by time of day, so "80/20 inference/training by day, reversed at night" is just two
windows over the same quota mechanism. Fair share orders teams that want more than their
guarantee by exponentially decayed past usage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.errors import SpecError

DAY_S = 86_400.0


@dataclass(frozen=True)
class TeamQuota:
    team: str
    guaranteed: Mapping[str, int]
    """GPUs per GPU type the team gets back whenever it has demand."""
    maximum: Mapping[str, int]
    """GPUs per GPU type the team may hold at most, borrowing included."""

    def __post_init__(self) -> None:
        for gpu_type, g in self.guaranteed.items():
            m = self.maximum.get(gpu_type, g)
            if g < 0:
                raise SpecError(
                    f"team {self.team}: guaranteed {gpu_type} GPUs must be >= 0, got {g}"
                )
            if m < g:
                raise SpecError(
                    f"team {self.team}: need 0 <= guaranteed <= max for {gpu_type}, "
                    f"got {g} > {m}; raise max or lower guaranteed"
                )


def clock_s(text: str) -> float:
    """'09:30' -> seconds after midnight."""
    try:
        hh, mm = text.split(":")
        h, m = int(hh), int(mm)
    except ValueError:
        raise SpecError(f"time of day {text!r}: write it as HH:MM") from None
    if not (0 <= h <= 24 and 0 <= m < 60) or h * 60 + m > 24 * 60:
        raise SpecError(f"time of day {text!r} is outside 00:00-24:00")
    return float(h * 3600 + m * 60)


@dataclass(frozen=True)
class QuotaWindow:
    """From `start_s` to `end_s` after midnight (wrapping past midnight if end < start),
    team quotas are replaced by these, as shares of each pool's GPUs."""

    start_s: float
    end_s: float
    guaranteed_share: Mapping[str, float]
    max_share: Mapping[str, float]

    def covers(self, t_s: float) -> bool:
        tod = t_s % DAY_S
        if self.start_s <= self.end_s:
            return self.start_s <= tod < self.end_s
        return tod >= self.start_s or tod < self.end_s


@dataclass
class QuotaBook:
    quotas: Sequence[TeamQuota]
    pool_gpus: Mapping[str, int]
    windows: Sequence[QuotaWindow] = ()
    half_life_s: float = 6 * 3600.0
    decayed: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [q.team for q in self.quotas]
        if len(set(names)) != len(names):
            raise SpecError("a team is listed twice under teams:")
        for gpu_type, total in self.pool_gpus.items():
            promised = sum(q.guaranteed.get(gpu_type, 0) for q in self.quotas)
            if promised > total:
                raise SpecError(
                    f"guarantees on {gpu_type} add up to {promised} GPUs but the pool has {total}; "
                    "lower them"
                )
        for w in self.windows:
            unknown = (set(w.guaranteed_share) | set(w.max_share)) - set(names)
            if unknown:
                raise SpecError(f"time window names unknown team(s): {', '.join(sorted(unknown))}")
            if sum(w.guaranteed_share.values()) > 1.0 + 1e-9:
                raise SpecError("a time window's guaranteed shares add up to more than 1")
        self._by_team = {q.team: q for q in self.quotas}

    @property
    def teams(self) -> list[str]:
        return [q.team for q in self.quotas]

    def window(self, t_s: float) -> QuotaWindow | None:
        for w in self.windows:
            if w.covers(t_s):
                return w
        return None

    def guaranteed(self, team: str, gpu_type: str, t_s: float) -> int:
        w = self.window(t_s)
        if w is not None and team in w.guaranteed_share:
            return math.floor(w.guaranteed_share[team] * self.pool_gpus.get(gpu_type, 0) + 1e-9)
        q = self._by_team.get(team)
        return 0 if q is None else q.guaranteed.get(gpu_type, 0)

    def maximum(self, team: str, gpu_type: str, t_s: float) -> int:
        w = self.window(t_s)
        total = self.pool_gpus.get(gpu_type, 0)
        if w is not None and team in w.max_share:
            return max(
                self.guaranteed(team, gpu_type, t_s), math.floor(w.max_share[team] * total + 1e-9)
            )
        q = self._by_team.get(team)
        if q is None:
            return total
        return max(self.guaranteed(team, gpu_type, t_s), q.maximum.get(gpu_type, total))

    def record_usage(self, usage_gpu: Mapping[str, float], dt_s: float) -> None:
        """Decay past usage and add this interval's GPU-seconds (fair-share history)."""
        keep = 0.5 ** (dt_s / self.half_life_s)
        for team in self.teams:
            self.decayed[team] = (
                self.decayed.get(team, 0.0) * keep + usage_gpu.get(team, 0.0) * dt_s
            )

    def fair_rank(self, team: str) -> float:
        """Decayed usage per guaranteed GPU: lower ranks first when borrowing."""
        q = self._by_team.get(team)
        weight = max(1, sum(q.guaranteed.values())) if q is not None else 1
        return self.decayed.get(team, 0.0) / weight
