"""The core's co-location admission (a `domain.colocation.PairAdmission`) and its guard.

The cluster state asks it only after the hard rules (online inference never next to
training or batch work, the share cap, one team per card, measured load): it can only
refuse more. A job joins a card's sharer when both predicted speeds are at least
`min_speed`; while the guard has fallen back, when the utilisation-sum rule admits the
pair. A job or sharer without a solo profile (looked up by `JobSpec.name`) is admitted as
before this admission existed: neither the model nor the rule knows anything of it.

The guard judges the model on what the driver measured (`observe`, from Progress): every
co-located pair of profiled jobs the model admits (or would admit, while the rule decides)
counts once, slowed if either job ran below `SLOW_SPEED`. Over the last `window_pairs`
such pairs, a slowed share above `max_slowed_share` hands admission to the rule, with a
sentence for the event log; it comes back once the share is at most that bound less
`recover_margin` (hysteresis).

In shadow mode the rule decides and the model is only judged: the guard counts the pairs
the model would have admitted, so `promotion_problem` can say whether its record carries
a switch to active (`set_mode`) before it decides anything.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.domain.model import JobSpec
from gpupool.errors import SpecError
from gpupool.learning.colocation import SLOW_SPEED, PairSpeedModel, SumRule
from gpupool.traces.lucid import SoloProfile


class AdmissionMode(enum.Enum):
    LEARNED = "learned"
    """The predictor decides (under the guard)."""
    RULE = "rule"
    """The utilisation-sum rule always decides (the opponent)."""
    SHADOW = "shadow"
    """The rule decides; the predictor's answers are judged on measured speeds only."""


LEARNER_MODES = {"active": AdmissionMode.LEARNED, "shadow": AdmissionMode.SHADOW}
"""A learned admission's modes by the names configuration and promotion use."""


@dataclass(frozen=True)
class ColocationGuardConfig:
    window_pairs: int = 100
    min_pairs: int = 100
    """Judged pairs before the guard may change anything. Judging only full windows: with
    30, one of six simulated runs fell back on its first 30 pairs (5 slowed) by chance."""
    max_slowed_share: float = 0.15
    """Above the rule's own share on the Lucid pairs (11% of those it admits) and about
    twice what the learned admission's pairs show in the simulator
    (bench/bench_colocation.py); over 100 pairs that natural rate's noise (sd about 2.5
    pairs) stays well below it."""
    recover_margin: float = 0.05

    def __post_init__(self) -> None:
        if not 1 <= self.min_pairs <= self.window_pairs:
            raise SpecError("colocation guard: need 1 <= min_pairs <= window_pairs")
        if not 0.0 <= self.recover_margin <= self.max_slowed_share <= 1.0:
            raise SpecError("colocation guard: need 0 <= recover_margin <= max_slowed_share <= 1")


@dataclass(frozen=True)
class GuardChange:
    t_s: float
    trusted: bool
    reason: str


class ColocationGuard:
    """Trusted until the model's admitted pairs are measured slowed too often."""

    def __init__(self, config: ColocationGuardConfig | None = None) -> None:
        self.config = config or ColocationGuardConfig()
        self.window: deque[bool] = deque(maxlen=self.config.window_pairs)
        self.trusted = True
        self.changes: list[GuardChange] = []
        self.judged = 0
        """Pairs recorded since start (the window keeps only the last `window_pairs`)."""

    @property
    def slowed_share(self) -> float | None:
        """The slowed share of the window's pairs; None before the first."""
        return sum(self.window) / len(self.window) if self.window else None

    def record(self, t_s: float, slowed: bool) -> GuardChange | None:
        self.window.append(slowed)
        self.judged += 1
        c = self.config
        n = len(self.window)
        if n < c.min_pairs:
            return None
        bad = sum(self.window)
        share = bad / n
        figures = (
            f"{bad} of the last {n} pairs it admits measured below {SLOW_SPEED:.2f}x ({share:.0%}"
        )
        change: GuardChange | None = None
        if self.trusted and share > c.max_slowed_share:
            change = GuardChange(
                t_s,
                False,
                f"co-location model drifted, the utilisation rule decides: {figures}, "
                f"bound {c.max_slowed_share:.0%})",
            )
        elif not self.trusted and share <= c.max_slowed_share - c.recover_margin + 1e-9:
            change = GuardChange(
                t_s,
                True,
                f"co-location model recovered, it decides again: {figures}, needs "
                f"{c.max_slowed_share - c.recover_margin:.0%} or less)",
            )
        if change is not None:
            self.trusted = change.trusted
            self.changes.append(change)
        return change


@dataclass(frozen=True)
class MeasuredPair:
    """Two jobs sharing one card and the speed the driver measured for each."""

    first: JobSpec
    second: JobSpec
    first_speed: float
    second_speed: float


class PairAdmissionPolicy:
    """Learned or rule admission of a sharing job next to a card's sharers."""

    def __init__(
        self,
        profiles: Mapping[str, SoloProfile],
        rule: SumRule,
        model: PairSpeedModel | None = None,
        min_speed: float = SLOW_SPEED,
        mode: AdmissionMode = AdmissionMode.LEARNED,
        guard: ColocationGuard | None = None,
    ) -> None:
        if mode is not AdmissionMode.RULE and model is None:
            raise SpecError(f"{mode.value} co-location admission needs a predictor")
        self.profiles = dict(profiles)
        self.rule = rule
        self.model = model
        self.min_speed = min_speed
        self.mode = mode
        self.guard = guard or ColocationGuard()
        self.decided: dict[tuple[str, str, bool], str | None] = {}
        """Each pair of profiles' answer under each decider (placement asks often)."""
        self.judged: set[frozenset[str]] = set()
        """Pairs (job ids) already counted by the guard: each pair counts once."""
        self.measured_note: str | None = None
        """Set by a driver that cannot measure speeds: why the guard gets no pairs."""

    @property
    def learner_mode(self) -> str | None:
        """active or shadow (LEARNER_MODES); None for the rule."""
        return next((k for k, m in LEARNER_MODES.items() if m is self.mode), None)

    @property
    def learned_decides(self) -> bool:
        return self.mode is AdmissionMode.LEARNED and self.guard.trusted

    def set_mode(self, mode: AdmissionMode, force: bool = False) -> None:
        """Switch between shadow and active (LEARNED) at run time. A promotion to active
        is refused (SpecError with `promotion_problem`'s sentence) unless `force`; the
        caller replans (the answers cached per decider stay valid)."""
        if self.model is None or mode is AdmissionMode.RULE:
            raise SpecError(
                "only a learned co-location admission switches mode, between shadow and active"
            )
        if mode is AdmissionMode.LEARNED and not force:
            why = self.promotion_problem()
            if why is not None:
                raise SpecError(f"co-location promotion refused: {why}")
        self.mode = mode

    def promotion_problem(self) -> str | None:
        """Why a switch to active would be refused now; None: the record carries it."""
        c = self.guard.config
        if self.model is None:
            return "the decider is the rule: there is no model to promote"
        if self.mode is AdmissionMode.LEARNED:
            return "the model is already active"
        n = len(self.guard.window)
        if n < c.min_pairs:
            return (
                f"only {self.guard.judged} co-located pairs judged, the guard needs "
                f"{c.min_pairs} measured pairs the model admits"
            )
        share = self.guard.slowed_share or 0.0
        if share > c.max_slowed_share:
            return (
                f"{share:.0%} of the last {n} pairs the model admits were measured below "
                f"{SLOW_SPEED:.2f}x, above the bound {c.max_slowed_share:.0%}"
            )
        if not self.guard.trusted:
            return (
                f"the guard has not recovered: {share:.0%} of the last {n} pairs slowed, "
                f"needs {c.max_slowed_share - c.recover_margin:.0%} or less"
            )
        return None

    def status(self) -> dict[str, object]:
        """What GET /v1/learn shows of the admission (plain values, JSON-ready)."""
        g, c = self.guard, self.guard.config
        last = g.changes[-1] if g.changes else None
        if self.mode is AdmissionMode.RULE:
            why = "the configured decider is the utilisation-sum rule"
        elif self.mode is AdmissionMode.SHADOW:
            why = "shadow mode: the rule decides, the model's answers are only judged"
        elif g.trusted:
            why = "active, and the guard trusts the model"
        else:
            why = "active, but the guard fell back to the rule" + (
                f": {last.reason}" if last is not None else ""
            )
        return {
            "decider": "rule" if self.model is None else "learned",
            "mode": self.learner_mode,
            "decides": "model" if self.learned_decides else "rule",
            "why": why,
            "profiles": len(self.profiles),
            "min_speed": self.min_speed,
            "max_sum_sm_pct": self.rule.max_sum_sm_pct,
            "pairs_judged": g.judged,
            "window_pairs": len(g.window),
            "slowed_share": g.slowed_share,
            "max_slowed_share": c.max_slowed_share,
            "min_pairs": c.min_pairs,
            "trusted": g.trusted,
            "guard_changes": len(g.changes),
            "last_change": None if last is None else last.reason,
            "last_change_s": None if last is None else last.t_s,
            "measured_speeds": self.measured_note is None,
            "measured_note": self.measured_note,
            "promotion_problem": self.promotion_problem(),
        }

    def model_admits(self, a: SoloProfile, b: SoloProfile) -> tuple[bool, str]:
        assert self.model is not None
        sa, sb = self.model.predict(a, b)
        ok = min(sa, sb) >= self.min_speed
        return ok, (
            f"predicted speeds {sa:.2f}x and {sb:.2f}x next to {b.key} "
            f"(needs {self.min_speed:.2f}x)"
        )

    def pair_problem(self, a: SoloProfile, b: SoloProfile) -> str | None:
        key = (a.key, b.key, self.learned_decides)
        if key not in self.decided:
            self.decided[key] = self.decide(a, b)
        return self.decided[key]

    def decide(self, a: SoloProfile, b: SoloProfile) -> str | None:
        if self.learned_decides:
            ok, why = self.model_admits(a, b)
            return None if ok else why
        if self.rule.admits(a, b):
            return None
        return (
            f"solo SM utilisations {a.sm_util_pct:.0f}% + {b.sm_util_pct:.0f}% next to "
            f"{b.key} exceed {self.rule.max_sum_sm_pct:.0f}%"
        )

    def problem(self, job: JobSpec, sharers: tuple[JobSpec, ...]) -> str | None:
        own = self.profiles.get(job.name)
        if own is None:
            return None
        for other in sharers:
            theirs = self.profiles.get(other.name)
            if theirs is None:
                continue
            why = self.pair_problem(own, theirs)
            if why is not None:
                return why
        return None

    def observe(self, t_s: float, measured: Sequence[MeasuredPair]) -> list[GuardChange]:
        """Measured pairs (each counts once); the guard's changes, if any."""
        out: list[GuardChange] = []
        current: set[frozenset[str]] = set()
        for m in measured:
            ids = frozenset((m.first.job_id, m.second.job_id))
            current.add(ids)
            if ids in self.judged or self.model is None:
                continue
            a, b = self.profiles.get(m.first.name), self.profiles.get(m.second.name)
            if a is None or b is None:
                continue
            self.judged.add(ids)
            if not self.model_admits(a, b)[0]:
                continue  # the rule admitted what the model would not: says nothing of it
            slowed = min(m.first_speed, m.second_speed) < SLOW_SPEED
            change = self.guard.record(t_s, slowed)
            if change is not None:
                out.append(change)
        self.judged &= current  # a pair that split and meets again is a new pair
        return out
