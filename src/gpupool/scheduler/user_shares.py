"""Fair share inside a team: its users' GPU use, decayed, orders the team's queue; and
priority aging (`priority_aging_h`), which raises a waiting job's place with its wait.

The policy orders the queue as always (teams, priority classes, age); inside each team and
class the jobs keep the places the team's jobs had, and the user who used least takes the
next one. A user's use is the GPU-seconds of its ended runs, halved every
`fair_share.half_life_h`, plus the GPU-seconds its running jobs have held so far; each job
of the user placed ahead in the order counts as `QUANTUM_S` more of its GPUs, so users of
equal use alternate. With one user per team the order is the policy's own: nothing is
computed. Pure: fed event times, never reads a clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpupool.domain.model import JobKind, JobSpec
from gpupool.scheduler.config import FairShareConfig
from gpupool.scheduler.jobs import JobRecord

QUANTUM_S = 3600.0
"""What one queued job charges its user while the queue is ordered: an hour of its GPUs."""

UserKey = tuple[str, str]
"""(team, user)."""


class UserShares:
    """Each (team, user)'s decayed GPU use, and the fair order of the waiting jobs."""

    def __init__(self, config: FairShareConfig) -> None:
        self.on = config.users
        self.half_life_s = config.half_life_h * 3600.0
        self.users: dict[str, set[str]] = defaultdict(set)
        """The users seen in each team."""
        self.active = False
        """Some team has more than one user: only then is the order changed."""
        self.used: dict[UserKey, tuple[float, float]] = {}
        """(GPU-seconds, when last charged) of each user's ended runs."""

    def note(self, spec: JobSpec) -> None:
        """A job of `spec.user` joined (a submit, or a restart's restore)."""
        if not self.on:
            return
        users = self.users[spec.team]
        users.add(spec.user)
        self.active = self.active or len(users) > 1

    def stopped(self, r: JobRecord, at: float) -> None:
        """A run left its GPUs (finished, vacated, lost): charge its GPU-seconds."""
        if not self.on:
            return
        self.charge(
            (r.spec.team, r.spec.user), r.spec.gpu_count * max(0.0, at - r.run_started_s), at
        )

    def charge(self, key: UserKey, gpu_s: float, at: float) -> None:
        self.used[key] = (self.decayed(key, at) + gpu_s, at)

    def decayed(self, key: UserKey, now: float) -> float:
        """The user's ended runs' GPU-seconds as seen at `now`."""
        used, since = self.used.get(key, (0.0, now))
        if used == 0.0 or now <= since:
            return used
        return used * math.pow(0.5, (now - since) / self.half_life_s)

    def usage(self, now: float, running: Iterable[JobRecord]) -> dict[UserKey, float]:
        """Each user's use at `now`: ended runs decayed, plus its running jobs so far."""
        out = {key: self.decayed(key, now) for key in self.used}
        for r in running:
            key = (r.spec.team, r.spec.user)
            out[key] = out.get(key, 0.0) + r.spec.gpu_count * max(0.0, now - r.run_started_s)
        return out

    def rank(
        self,
        now: float,
        waiting: Iterable[JobRecord],
        running: Iterable[JobRecord],
        boost: Mapping[str, int] | None = None,
    ) -> dict[str, int]:
        """Positions of the waiting jobs: the policy's class order (online first, then
        priority, raised by `boost` where aging gives one, then age), with each team's
        places in a class refilled fairly."""
        online = JobKind.ONLINE
        lift = boost or {}

        def priority(r: JobRecord) -> int:
            return r.spec.priority + lift.get(r.job_id, 0)

        jobs = sorted(
            waiting, key=lambda r: (r.spec.kind is not online, -priority(r), r.ready_s, r.job_id)
        )
        if self.active:
            groups: dict[tuple[str, bool, int], list[int]] = defaultdict(list)
            for k, r in enumerate(jobs):
                groups[(r.spec.team, r.spec.kind is online, priority(r))].append(k)
            used = self.usage(now, running)
            for slots in groups.values():
                members = [jobs[k] for k in slots]
                if len({r.spec.user for r in members}) > 1:
                    for k, r in zip(slots, fair_order(members, used), strict=True):
                        jobs[k] = r
        return {r.job_id: k for k, r in enumerate(jobs)}


def fair_order(members: list[JobRecord], used: Mapping[UserKey, float]) -> list[JobRecord]:
    """One team's jobs of one class, in age order, reordered: the user with the least use
    (its queued jobs already placed counted at QUANTUM_S each) goes next; on a tie, the
    user whose next job is older."""
    queues: dict[str, list[JobRecord]] = defaultdict(list)
    for r in members:
        queues[r.spec.user].append(r)
    charge = {u: used.get((q[0].spec.team, u), 0.0) for u, q in queues.items()}
    heads = dict.fromkeys(queues, 0)
    position = {r.job_id: k for k, r in enumerate(members)}
    out: list[JobRecord] = []
    while len(out) < len(members):
        user = min(
            (u for u in queues if heads[u] < len(queues[u])),
            key=lambda u: (charge[u], position[queues[u][heads[u]].job_id]),
        )
        r = queues[user][heads[user]]
        heads[user] += 1
        charge[user] += r.spec.gpu_count * QUANTUM_S
        out.append(r)
    return out


def priority_boosts(
    now: float, waiting: Iterable[JobRecord], aging_s: float
) -> tuple[dict[str, int], float]:
    """Priority aging: each waiting batch or training job gains one priority point per
    `aging_s` it has waited (since it last became runnable), for the queue's order only
    (preemption still compares the priorities given). Returns the boosts and when the next
    one changes (the order must be planned again then)."""
    boosts: dict[str, int] = {}
    next_s = math.inf
    for r in waiting:
        if r.spec.kind is JobKind.ONLINE:
            continue
        points = int(max(0.0, now - r.ready_s) // aging_s)
        if points:
            boosts[r.job_id] = points
        next_s = min(next_s, r.ready_s + (points + 1) * aging_s)
    return boosts, next_s
