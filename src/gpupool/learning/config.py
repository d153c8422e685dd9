"""The learning section of the scheduling configuration, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.errors import SpecError
from gpupool.learning.guard import GuardConfig
from gpupool.learning.ordering import LasQueues

MODES = ("off", "shadow", "active")
LEARNERS = ("order", "forecast", "colocation")
"""What `gpupool learn promote|demote` names: the learned job order, the services' demand
forecast, the learned co-location admission. Each has a shadow and an active mode, kept
apart."""
RULES = ("las", "gittins")
MODEL_ORDERS = ("gittins", "remaining")
"""How the predicted order ranks a job (LearningConfig.model_order)."""
PREDICTORS = ("lightgbm", "recent-median", "shuffled", "inverted")
"""The last two are deliberately wrong (fault injection, to test the guard)."""


@dataclass(frozen=True)
class LearningConfig:
    mode: str = "off"
    """off: rules only; shadow: the learned order is computed and recorded next to what the
    rules did, never acted on; active: the learned order decides, under the guard."""
    rule: str = "gittins"
    """The rule order the learned one mixes with and falls back to."""
    weight: float = 1.0
    """Share of picks that follow the predicted order (preferential round-robin)."""
    max_spread: float = 100.0
    """A job whose predicted q90/q10 is above this follows the rule order only."""
    model_order: str = "gittins"
    """gittins: by the Gittins index of the job's own predicted distribution (its
    predicted median scaled by the recent errors of the model), so a sure prediction
    ranks like shortest-remaining-first and a doubtful one like 2D-Gittins; remaining:
    by predicted GPU-time still to go (median, then q90, then the rule order)."""
    retrain_every_s: float = 7 * 86_400.0
    predictor: str = "lightgbm"
    guarded: bool = True
    """False only for experiments: use the model whatever its accuracy (cold start kept)."""
    seed: int = 0
    guard: GuardConfig = field(default_factory=GuardConfig)
    las: LasQueues = field(default_factory=LasQueues)
    max_wait_s: float | None = 86_400.0
    """The age bound of the core's ordered policies: a job waiting longer than this goes
    first in its priority class whatever the order says. None: no bound."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"learning.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.rule not in RULES:
            raise SpecError(f"learning.rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.model_order not in MODEL_ORDERS:
            raise SpecError(
                f"learning.model_order must be one of {', '.join(MODEL_ORDERS)}, "
                f"got {self.model_order!r}"
            )
        if self.predictor not in PREDICTORS:
            raise SpecError(
                f"learning.predictor must be one of {', '.join(PREDICTORS)}, got {self.predictor!r}"
            )
        if not 0.0 <= self.weight <= 1.0:
            raise SpecError(f"learning.weight must be in 0..1, got {self.weight}")
        if self.max_spread < 1.0:
            raise SpecError(f"learning.max_spread must be >= 1, got {self.max_spread}")
        if self.retrain_every_s <= 0:
            raise SpecError(f"learning.retrain_every_s must be > 0, got {self.retrain_every_s}")
        if self.max_wait_s is not None and self.max_wait_s <= 0:
            raise SpecError(
                f"learning.max_wait_s must be > 0 (or null for no age bound), got {self.max_wait_s}"
            )
