"""The learned policy in the live service: shadow records, the stored mode, promotion.

The decision core decides; this module only keeps the live service's side of it:
- what the learner is seeded with at start (the database's finished jobs as outcomes),
- a bounded record of shadow cycles (counts in memory, one `learn-shadow` event at most
  every `every_s` seconds, naming how many differing cycles it stands for),
- the check a promotion's evidence must pass (a replay of this cluster's own history,
  run by the CLI, where the learned policy's mean JCT is below the rule's on enough jobs).

Nothing here runs a simulation: the replay belongs to the CLI (`gpupool learn promote`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.errors import ConflictError, NotFoundError
from gpupool.learning.history import JobFacts, Outcome
from gpupool.scheduler.commands import LearnShadow
from gpupool.server.store import FinishedRun

SHADOW_EVENT_EVERY_S = 60.0
"""At most one learn-shadow event a minute; the counts in between are kept in memory."""


def outcomes_of(runs: Sequence[FinishedRun]) -> list[Outcome]:
    """The finished jobs as the learner's outcomes, in order of finish."""
    return [
        Outcome(
            JobFacts(
                job_id=str(r.job_id),
                submit_s=r.submit_s,
                gpu_count=r.gpu_count,
                team=r.team,
                gpu_type=r.gpu_model or "",
                name=r.name,
            ),
            r.finish_s,
            r.gpu_time_s,
        )
        for r in sorted(runs, key=lambda r: (r.finish_s, r.job_id))
    ]


@dataclass
class ShadowTally:
    """The shadow records the core returned since the service started (the core returns
    one only for a cycle where the learned plan differs from the rules'; it counts the
    cycles and the agreement itself): which to write, and how many stood behind each."""

    every_s: float = SHADOW_EVENT_EVERY_S
    differed: int = 0
    written: int = 0
    last_event_s: float = -math.inf
    unwritten: int = 0
    """Differing cycles since the last learn-shadow event (not written one by one)."""

    def record(self, c: LearnShadow) -> tuple[str, dict[str, Any]] | None:
        """Count a record; the event to write (message, data) when one is due, else None."""
        if c.agree:
            return None
        self.differed += 1
        self.unwritten += 1
        if c.t_s - self.last_event_s < self.every_s:
            return None
        stands_for = self.unwritten
        self.unwritten = 0
        self.written += 1
        self.last_event_s = c.t_s
        rule = ", ".join(c.rule_starts) or "nothing"
        learned = ", ".join(c.learned_starts) or "nothing"
        message = (
            f"shadow: the learned policy would have started {learned}; the rules started {rule}"
        )
        if stands_for > 1:
            message += (
                f" (this event stands for {stands_for} differing cycles since the last one; "
                f"at most one is written every {self.every_s:g} s)"
            )
        data = {
            "rule_starts": list(c.rule_starts),
            "learned_starts": list(c.learned_starts),
            "differing_cycles": stands_for,
        }
        return message, data

    def view(self) -> dict[str, Any]:
        return {
            "differed": self.differed,
            "events_written": self.written,
            "event_every_s": self.every_s,
        }


@dataclass(frozen=True)
class Evidence:
    """What a replay of this cluster's history showed, as a promotion carries it."""

    days: float
    jobs: int
    rule: str
    rule_mean_jct_s: float
    learned_mean_jct_s: float

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Evidence:
        return cls(
            float(body["days"]),
            int(body["jobs"]),
            str(body["rule"]),
            float(body["rule_mean_jct_s"]),
            float(body["learned_mean_jct_s"]),
        )

    @property
    def gain(self) -> float:
        """Share of the rule's mean JCT the learned policy saves (negative: it loses)."""
        if self.rule_mean_jct_s <= 0:
            return 0.0
        return 1.0 - self.learned_mean_jct_s / self.rule_mean_jct_s


def require_learning(on: bool, policy: str) -> None:
    """Refuse (NotFoundError, a 404) to show, promote or demote a learned policy that this
    server does not run (`on`: its policy is `learned`)."""
    if not on:
        raise NotFoundError(
            f"this server schedules with policy {policy!r}, not "
            "'learned': there is no learned policy to show, promote or demote; set "
            "`policy: learned` and a `learning:` section in the --config file of "
            "`gpupool serve`"
        )


def check_evidence(ev: Evidence, rule: str, min_jobs: int, finished_in_window: int) -> None:
    """Refuse (ConflictError, a 409) a promotion the evidence does not carry."""
    if ev.rule != rule:
        raise ConflictError(
            f"the evidence compares against rule {ev.rule!r}, but this server's learned "
            f"policy falls back to {rule!r}; run `gpupool learn promote` again to replay "
            "against the right rule"
        )
    if ev.jobs > finished_in_window:
        raise ConflictError(
            f"the evidence claims {ev.jobs} replayed jobs, but only {finished_in_window} "
            f"finished here in the last {ev.days:g} days; replay this server's own history "
            "(`gpupool learn promote`)"
        )
    if ev.jobs < min_jobs:
        raise ConflictError(
            f"promotion refused: the replay covered {ev.jobs} finished jobs, fewer than the "
            f"{min_jobs} the guard needs (learning.guard.min_finished); let more jobs finish, "
            "or replay more days (--days)"
        )
    if not ev.learned_mean_jct_s < ev.rule_mean_jct_s:
        raise ConflictError(
            f"promotion refused: on the replay of the last {ev.days:g} days ({ev.jobs} jobs) "
            f"the learned policy's mean JCT is {ev.learned_mean_jct_s:.1f} s, not below "
            f"{ev.rule}'s {ev.rule_mean_jct_s:.1f} s; it stays in shadow"
        )
