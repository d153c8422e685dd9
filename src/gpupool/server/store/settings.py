"""What the service was configured with that a later reader needs, and the learned
policy's mode with the record of its promotions and demotions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from gpupool.domain.job_fields import as_json
from gpupool.errors import SpecError
from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.rows import LearningChange, LearningMode
from gpupool.server.store.states import LEARNING_MODES
from gpupool.server.store.tables import LearningChangeModel, LearningModeModel, SettingModel


def learning_change(m: LearningChangeModel) -> LearningChange:
    return LearningChange(
        m.id, m.at_s, m.action, m.mode, m.by, m.reason, dict(m.evidence), m.learner
    )


def mode_key(learner: str) -> str:
    """The learning_mode row of a learner: "mode" for the job order (revision 0010 wrote
    it so), the learner's own name for the others."""
    return "mode" if learner == "order" else learner


@dataclass(frozen=True)
class Settings(Repository):
    """Stored settings and the learned policy's mode."""

    @transaction
    def put(self, key: str, value: Any, now_s: float) -> None:
        with self.db.write() as s:
            found = s.get(SettingModel, key)
            if found is None:
                s.add(SettingModel(key=key, value=value, updated_at=now_s))
            else:
                found.value, found.updated_at = value, now_s

    @transaction
    def get(self, key: str) -> Any:
        """A stored setting's value; None when never stored."""
        with self.db.read() as s:
            found = s.get(SettingModel, key)
            return None if found is None else found.value

    @transaction
    def learning_mode(self, learner: str = "order") -> LearningMode | None:
        """A learner's mode last set (promote, demote, or the first start); None when never
        set."""
        with self.db.read() as s:
            found = s.get(LearningModeModel, mode_key(learner))
            return None if found is None else LearningMode(found.mode, found.set_at_s, found.reason)

    @transaction
    def set_learning_mode(
        self,
        mode: str,
        now_s: float,
        reason: str,
        action: str | None = None,
        by: str = "",
        evidence: Mapping[str, Any] | None = None,
        learner: str = "order",
    ) -> LearningChange | None:
        """Store the mode; with an action (promote, demote, fallback) also record the change
        and its evidence, in the same transaction. Returns the change recorded, if any."""
        if mode not in LEARNING_MODES:
            raise SpecError(
                f"learning mode must be one of {', '.join(LEARNING_MODES)}, got {mode!r}"
            )
        with self.db.write() as s:
            key = mode_key(learner)
            found = s.get(LearningModeModel, key)
            if found is None:
                s.add(LearningModeModel(key=key, mode=mode, set_at_s=now_s, reason=reason))
            else:
                found.mode, found.set_at_s, found.reason = mode, now_s, reason
            if action is None:
                return None
            change = LearningChangeModel(
                at_s=now_s,
                action=action,
                mode=mode,
                by=by,
                reason=reason,
                evidence=as_json(dict(evidence or {})),
                learner=learner,
            )
            s.add(change)
            s.flush()
            return learning_change(change)

    @transaction
    def learning_changes(self, limit: int = 20, learner: str | None = None) -> list[LearningChange]:
        """Promotions and demotions (of one learner, or of all), newest first."""
        query = select(LearningChangeModel).order_by(LearningChangeModel.id.desc()).limit(limit)
        if learner is not None:
            query = query.where(LearningChangeModel.learner == learner)
        with self.db.read() as s:
            return [learning_change(m) for m in s.scalars(query)]
