"""The core's side of the ordered policies: what it feeds the LearnedOrdering, and the
order it hands each cycle's plan.

The core tells the ordering of every batch and training job it accepts (facts known at
submit), of every job that finished (its GPU-time: work done x GPUs) and of the passing
of each cycle (retraining and the guard); failed and cancelled jobs are forgotten. Each
planning cycle it asks for the order of the waiting jobs (attained GPU service = work
done x GPUs, arrival = submit) and turns it into positions, with the jobs that waited
past `max_wait_s` first. Pure: no clock, no process; the same calls give the same order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from gpupool.domain.model import JobKind
from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.factory import make_predictor
from gpupool.learning.history import JobFacts, Outcome
from gpupool.learning.learned import Candidate, LearnedOrdering
from gpupool.learning.ordering import preferential_merge
from gpupool.learning.predictor import Predictor
from gpupool.scheduler.commands import LearnGuard, LearnShadow
from gpupool.scheduler.jobs import JobRecord

LEARNED_MODES = ("shadow", "active")


def default_predictor(config: LearningConfig) -> Predictor:
    """The predictor the learned policy uses when the driver gives none: the one
    `learning.predictor` names, with the driver's time 0 as its clock origin."""
    return make_predictor(config)


class CoreLearning:
    """The ordering of one core, its mode and its shadow record."""

    def __init__(
        self,
        config: LearningConfig,
        policy: str,
        rule: str | None,
        learned: bool,
        predictor: Predictor | None = None,
    ) -> None:
        if learned and config.mode not in LEARNED_MODES:
            raise SpecError(
                f"policy learned needs learning.mode shadow (the rules decide, the learned "
                f"plan is recorded) or active, got {config.mode!r}; set learning.mode: shadow"
            )
        if not learned and config.mode != "off":
            raise SpecError(
                f"learning.mode {config.mode} runs the learned policy; set policy: learned "
                f"(with learning.rule: {rule or config.rule}) instead of policy: {policy}"
            )
        cfg = config if rule is None else dataclasses.replace(config, rule=rule)
        self.policy = policy
        self.config = cfg
        self.learned = learned
        self.mode = cfg.mode if learned else "off"
        self.ordering = LearnedOrdering(
            cfg, (predictor or default_predictor(cfg)) if learned else None
        )
        self.shadow_cycles = 0
        """Planning cycles where the rule plan or the learned plan started something."""
        self.shadow_agreed = 0
        """Of those, the cycles where both started the same jobs."""
        self.next_age_s = math.inf
        """When the next waiting job passes the age bound (its order changes then)."""
        self._last_submit_s = -math.inf
        self._last_finish_s = -math.inf

    # ---- what happened ---------------------------------------------------------------
    def submitted(self, facts: JobFacts) -> None:
        """A job to order. A job restored after a restart may predate the last submit
        seen; it counts as submitted then (the history is kept in time order)."""
        if facts.submit_s < self._last_submit_s:
            facts = dataclasses.replace(facts, submit_s=self._last_submit_s)
        self._last_submit_s = facts.submit_s
        self.ordering.submitted(facts)

    def finished(self, job_id: str, at_s: float, gpu_time_s: float) -> None:
        at_s = max(at_s, self._last_finish_s)
        if job_id in self.ordering.facts:
            self._last_finish_s = at_s
        self.ordering.finished(job_id, at_s, max(0.0, gpu_time_s))

    def forget(self, job_id: str) -> None:
        self.ordering.forget(job_id)

    def tick(self, now_s: float) -> tuple[LearnGuard | None, bool]:
        """Retraining and the guard at a cycle: (the guard's change, whether the order
        may have changed)."""
        retrains = len(self.ordering.retrains)
        change = self.ordering.tick(now_s)
        moved = len(self.ordering.retrains) != retrains or change is not None
        if change is None:
            return None, moved
        return LearnGuard(change.t_s, change.after.value, change.reason), moved

    def seed(self, outcomes: Sequence[Outcome]) -> int:
        """Preload finished jobs (a restarted service's database); returns how many were
        new. Call it before the first submit: later ones are clamped to time order."""
        history = self.ordering.history
        fresh = [o for o in outcomes if o.facts.job_id not in self.ordering.facts]
        for o in sorted(fresh, key=lambda o: (o.facts.submit_s, o.facts.job_id)):
            submit = max(o.facts.submit_s, self._last_submit_s)
            history.submitted(dataclasses.replace(o.facts, submit_s=submit))
            self._last_submit_s = submit
        for o in sorted(fresh, key=lambda o: (o.finish_s, o.facts.job_id)):
            finish = max(o.finish_s, self._last_finish_s)
            history.finished(dataclasses.replace(o, finish_s=finish))
            self._last_finish_s = finish
        return len(fresh)

    # ---- the order -------------------------------------------------------------------
    def ranks(
        self, now_s: float, waiting: Iterable[JobRecord]
    ) -> tuple[dict[str, int], dict[str, int] | None]:
        """Positions of the waiting jobs for the plan that decides, and (shadow mode,
        once a model exists) for the learned plan that is only recorded."""
        records = list(waiting)
        candidates = [
            Candidate(r.job_id, r.done_s * r.spec.gpu_count, r.spec.submit_s) for r in records
        ]
        ordering = self.ordering
        rule = ordering.rule_order(candidates)
        use = rule
        shadow: list[str] | None = None
        weight = self.config.weight
        if self.mode == "active" and ordering.uses_model:  # ordering.order, rule sorted once
            use = preferential_merge(ordering.predicted_order(candidates), rule, weight)
        elif self.mode == "shadow" and self.model_ready:  # ordering.learned_order
            shadow = preferential_merge(ordering.predicted_order(candidates), rule, weight)
        aged = self._aged(now_s, records)
        classes = {r.job_id: (r.spec.kind is not JobKind.ONLINE, -r.spec.priority) for r in records}
        learned = None if shadow is None else self._positions(shadow, aged, classes)
        return self._positions(use, aged, classes), learned

    @property
    def model_ready(self) -> bool:
        p = self.ordering.predictor
        return p is not None and p.info is not None

    def _aged(self, now_s: float, records: Sequence[JobRecord]) -> list[str]:
        """Jobs waiting longer than the age bound, longest waiting first."""
        bound = self.config.max_wait_s
        self.next_age_s = math.inf
        if bound is None:
            return []
        aged: list[tuple[float, str]] = []
        for r in records:
            due = r.ready_s + bound
            if now_s > due:
                aged.append((r.ready_s, r.job_id))
            elif due < self.next_age_s:
                self.next_age_s = due
        aged.sort()
        return [job_id for _, job_id in aged]

    @staticmethod
    def _positions(
        order: Sequence[str], aged: Sequence[str], classes: Mapping[str, tuple[bool, int]]
    ) -> dict[str, int]:
        """Positions by priority class (online first, then the priority number), then the
        aged jobs, then the order: sorting by position alone keeps the classes apart."""
        seen = set(aged)
        ids = list(aged) + [job_id for job_id in order if job_id not in seen]
        at = {job_id: k for k, job_id in enumerate(ids)}
        ids.sort(key=lambda job_id: (classes[job_id], at[job_id]))
        return {job_id: k for k, job_id in enumerate(ids)}

    # ---- shadow and mode -------------------------------------------------------------
    def shadow(
        self, t_s: float, rule_starts: tuple[str, ...], learned_starts: tuple[str, ...]
    ) -> LearnShadow | None:
        """The record of one shadow plan: returned only where the two plans differ."""
        if not rule_starts and not learned_starts:
            return None
        record = LearnShadow(t_s, rule_starts, learned_starts)
        self.shadow_cycles += 1
        if record.agree:
            self.shadow_agreed += 1
            return None
        return record

    def set_mode(self, mode: str, t_s: float, reason: str) -> LearnGuard:
        if not self.learned:
            raise SpecError(
                f"the policy is {self.policy}; only policy learned has a shadow and an active "
                "mode: set policy: learned"
            )
        if mode not in LEARNED_MODES:
            raise SpecError(
                f"learning mode must be one of {', '.join(LEARNED_MODES)}, got {mode!r}"
            )
        self.mode = mode
        return LearnGuard(t_s, "promoted" if mode == "active" else "demoted", reason)

    def status(self) -> dict[str, object]:
        out = self.ordering.status()
        out.update(
            {
                "policy": self.policy,
                "mode": self.mode,
                "max_wait_s": self.config.max_wait_s,
                "shadow_cycles": self.shadow_cycles,
                "shadow_agreed": self.shadow_agreed,
                "agreement": self.shadow_agreed / self.shadow_cycles
                if self.shadow_cycles
                else None,
            }
        )
        return out
