"""The core's learners, each with a shadow and an active mode: the learned job order
(`ordering.CoreLearning`), the services' demand forecast (`cycle.autoscale`), and the
learned co-location admission where one is given (`learning.colocation_admission`). One
place answers `gpupool learn promote|demote` for any of them: who the learner is, whether
its own record allows a promotion, and the switch itself (a `LearnGuard` the drivers write
to their event log)."""

from __future__ import annotations

from typing import Any

from gpupool.errors import SpecError
from gpupool.learning.colocation_admission import LEARNER_MODES, PairAdmissionPolicy
from gpupool.learning.config import LEARNERS
from gpupool.learning.demand import TRUSTED
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import LearnGuard
from gpupool.scheduler.cycle.autoscale import ServiceAutoscale
from gpupool.scheduler.ordering import CoreLearning


def known_learner(learner: str) -> str:
    if learner not in LEARNERS:
        raise SpecError(f"unknown learner {learner!r}; choose {', '.join(LEARNERS)}")
    return learner


class Learners:
    """Promotion and demotion of each learner, by name."""

    def __init__(
        self,
        book: JobBook,
        ordering: CoreLearning | None,
        autoscale: ServiceAutoscale,
        colocation: PairAdmissionPolicy | None = None,
    ) -> None:
        self.book = book
        self.ordering = ordering
        self.autoscale = autoscale
        self.colocation = colocation

    def learned_colocation(self) -> PairAdmissionPolicy:
        if self.colocation is None or self.colocation.model is None:
            raise SpecError(
                "there is no learned co-location admission: set sharing.admission.decider: "
                "learned (with its profiles and pairs)"
            )
        return self.colocation

    def set_mode(self, learner: str, mode: str, t_s: float, reason: str) -> LearnGuard:
        """Promote `learner` to active or demote it to shadow; the next cycle plans anew."""
        if known_learner(learner) == "order":
            if self.ordering is None:
                raise SpecError(
                    "the policy has no learned order: only policy learned has a shadow and "
                    "an active mode; set policy: learned"
                )
            change = self.ordering.set_mode(mode, t_s, reason)
        elif learner == "colocation":
            wanted = LEARNER_MODES.get(mode)
            if wanted is None:
                raise SpecError(f"co-location mode must be active or shadow, got {mode!r}")
            # the caller checked the record (promotion_problem); a stored promotion restored
            # at start stands on the record it was granted on
            self.learned_colocation().set_mode(wanted, force=True)
            state = "promoted" if mode == "active" else "demoted"
            change = LearnGuard(t_s, state, reason, "colocation")
        else:
            change = self.autoscale.set_forecast_mode(mode, t_s, reason)
        self.book.dirty = True
        return change

    def mode(self, learner: str) -> str:
        """shadow or active now ("off" for a job order the policy does not learn)."""
        if known_learner(learner) == "order":
            return "off" if self.ordering is None else self.ordering.mode
        if learner == "colocation":
            if self.colocation is None or self.colocation.model is None:
                return "off"
            return self.colocation.learner_mode or "off"
        return self.autoscale.forecast_mode

    def evidence(self, learner: str) -> dict[str, Any]:
        """What a guard-judged learner's promotion rests on: its record now, per service
        for the forecast, and a one-line summary."""
        if known_learner(learner) == "order":
            raise SpecError("the job order's evidence is a replay: `gpupool learn promote` runs it")
        if learner == "colocation":
            policy = self.learned_colocation()
            guard = policy.guard
            summary = (
                f"of the last {len(guard.window)} co-located pairs the model admits, "
                f"{guard.slowed_share or 0.0:.0%} were measured below {policy.min_speed:.2f}x "
                f"(bound {guard.config.max_slowed_share:.0%})"
            )
            return {"learner": learner, "status": policy.status(), "summary": summary}
        status = dict(sorted(self.autoscale.forecast_status().items()))
        trusted = [
            f"{name} {st.learned_rel_mae or 0.0:.3f} against "
            f"{min(st.opponents_rel_mae.values(), default=0.0):.3f}"
            for name, st in status.items()
            if st.state == TRUSTED
        ]
        summary = (
            f"the forecast is trusted by its guard for {len(trusted)} of {len(status)} "
            f"services (relative error against the best simple opponent: {', '.join(trusted)})"
        )
        services = {
            name: {
                "state": st.state,
                "judged": st.judged,
                "learned_rel_mae": st.learned_rel_mae,
                "opponents_rel_mae": st.opponents_rel_mae,
                "p90_coverage": st.p90_coverage,
            }
            for name, st in status.items()
        }
        return {"learner": learner, "services": services, "summary": summary}

    def promotion_problem(self, learner: str) -> str | None:
        """Why a learner judged by its own guard may not be promoted now (None: it may).
        The job order is judged by a replay of the cluster's history instead (the CLI runs
        it and the server checks its evidence), so it has none here."""
        if known_learner(learner) == "order":
            return None
        if learner == "colocation":
            return self.learned_colocation().promotion_problem()
        return self.autoscale.forecast_promotion_problem()
