"""`sharing.admission`: which co-location admission the core runs, and how a driver that
has read the files builds it (`build_pair_admission`), so the live service and the
simulator decide alike from one configuration.

Pure: the paths are kept as the configuration resolved them; the drivers read the files
(traces/colocation_setup.py) and hand the profiles and pairs here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.errors import SpecError
from gpupool.learning.colocation import (
    SLOW_SPEED,
    PredictorSettings,
    SpeedPredictor,
    SumRule,
)
from gpupool.learning.colocation_admission import (
    LEARNER_MODES,
    AdmissionMode,
    ColocationGuard,
    ColocationGuardConfig,
    PairAdmissionPolicy,
)
from gpupool.traces.lucid import PairMeasurement, SoloProfile

DECIDERS = ("off", "rule", "learned")
ADMISSION_MODES = tuple(LEARNER_MODES)
RULE_ADMIT_SHARE = 0.73
"""The rule's default bound admits this share of the measured pairs (the rule's rate on
the Lucid pairs, bench/bench_colocation.py: 11% of what it admits is slowed)."""


@dataclass(frozen=True)
class PairAdmissionConfig:
    """Who may refuse a sharing job a card beyond the hard rules (none while `off`)."""

    decider: str = "off"
    """`off` (the hard rules alone), `rule` (the utilisation-sum rule) or `learned` (the
    speed predictor under its guard, or only judged in `shadow`)."""
    mode: str = "shadow"
    """learned only: `active` (the model decides under its guard) or `shadow` (the rule
    decides; the model is judged on measured speeds, never acted on)."""
    profiles: str | None = None
    """The job profiles CSV (name,sm_util_pct,mem_bw_util_pct,mem_mib), resolved against
    the configuration file's folder."""
    pairs: str | None = None
    """The measured pairs the model trains on (a Lucid folder: single_data.csv and
    colocate_info.csv); learned needs it, the rule's default bound is calibrated on it."""
    max_sum_sm_pct: float | None = None
    """The rule's bound on two jobs' summed solo SM utilisation; None: the bound that
    admits RULE_ADMIT_SHARE of the measured pairs."""
    min_speed: float = SLOW_SPEED
    """The model admits a pair when both predicted speeds (together over alone) reach this."""
    guard: ColocationGuardConfig = field(default_factory=ColocationGuardConfig)
    seed: int = 0
    """The predictor's seed: the same pairs and seed give the same model."""

    def __post_init__(self) -> None:
        if self.decider not in DECIDERS:
            raise SpecError(f"decider {self.decider!r}; choose one of {', '.join(DECIDERS)}")
        if self.mode not in ADMISSION_MODES:
            raise SpecError(f"mode {self.mode!r}; choose {' or '.join(ADMISSION_MODES)}")
        if self.decider == "off":
            return
        if self.profiles is None:
            raise SpecError(
                "profiles: give the CSV of each job's solo profile "
                "(name,sm_util_pct,mem_bw_util_pct,mem_mib)"
            )
        if self.decider == "learned" and self.pairs is None:
            raise SpecError(
                "pairs: the learned decider trains on measured pairs; give their folder"
            )
        if self.decider == "rule" and self.pairs is None and self.max_sum_sm_pct is None:
            raise SpecError("the rule needs max_sum_sm_pct, or pairs to calibrate its bound on")
        if not 0.0 < self.min_speed <= 1.0:
            raise SpecError(f"min_speed {self.min_speed:g}: give a speed in (0, 1]")

    @property
    def on(self) -> bool:
        return self.decider != "off"


def build_pair_admission(
    config: PairAdmissionConfig,
    jobs: Mapping[str, SoloProfile],
    measured_profiles: Mapping[str, SoloProfile],
    pairs: Sequence[PairMeasurement],
) -> PairAdmissionPolicy:
    """The configured admission for jobs profiled by name (`jobs`), its model trained on
    `pairs` of `measured_profiles` (deterministic: one thread, `config.seed`)."""
    if config.max_sum_sm_pct is not None:
        rule = SumRule(config.max_sum_sm_pct)
    else:
        rule = SumRule.calibrated(pairs, measured_profiles, RULE_ADMIT_SHARE)
    model = None
    if config.decider == "learned":
        model = SpeedPredictor(pairs, measured_profiles, PredictorSettings(seed=config.seed))
    mode = {
        "rule": AdmissionMode.RULE,
        "learned": LEARNER_MODES[config.mode],
    }[config.decider]
    return PairAdmissionPolicy(
        jobs, rule, model, config.min_speed, mode, ColocationGuard(config.guard)
    )
