"""Borrowing without interruption: elastic jobs lend GPUs to online work and grow back.

An elastic job (`--gpus 2..4`, JobSpec.gpu_count_min) runs on any count in its range.
When an online-inference job (a service replica included) cannot be placed and no GPU is
free, the core shrinks running elastic jobs toward their minimum (Resize) before the
cycle policy would preempt anyone: the job checkpoints, its processes leave (the driver
reports Resized), the online job starts on the freed cards, and the elastic job
restarts on the rest. It stays RUNNING throughout and no preemption is counted. Once no
online job waits in its pool and cards are idle, it grows back after a hold-down
(ElasticConfig.grow_after_s) so that it does not flap with the load.

A shrinking job keeps its old placement in the core's state until Resized (its
processes still hold the cards); a growing job takes its new cards at once. Only jobs on
one node resize, and only on that node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec, NodeShare, Placement
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.errors import PlanRejected
from gpupool.scheduler.commands import Command, Launch, Resize
from gpupool.scheduler.config import ElasticConfig
from gpupool.scheduler.jobs import JobRecord

if TYPE_CHECKING:
    from gpupool.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class PendingResize:
    """A Resize sent and not yet reported done (Resized)."""

    placement: Placement
    old_count: int
    lent_to: tuple[str, ...]
    """Online jobs waiting for the cards it gives up (empty: it grows)."""


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class Elastic:
    """The core's elastic jobs: their declared size, resizes in flight, last resize time."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.enabled = config.resize
        """Off where the driver's executor cannot restart a job on other GPUs (Ray)."""
        self.declared: dict[str, int] = {}
        """Each elastic job's GPU count as submitted (its maximum)."""
        self.pending: dict[str, PendingResize] = {}
        self.last_s: dict[str, float] = {}
        self.claimants: set[str] = set()
        """Online jobs waiting for cards an elastic job is giving back: the core starts
        them once it has (Resized); the cycle policy does not see them meanwhile, so it
        neither preempts for them nor gives them cards another online job needs."""
        self.idle_since: dict[str, float] = {}
        """Since when cards it could grow onto have been idle (reset when none are)."""
        self.resizes = 0

    # ---- bookkeeping hooks ----------------------------------------------------------------
    def track(self, job: JobSpec) -> None:
        if job.elastic:
            self.declared[job.job_id] = self.declared.get(job.job_id, job.gpu_count)

    def fraction(self, r: JobRecord) -> float:
        """Its speed relative to its declared size (work is measured at full size)."""
        full = self.declared.get(r.spec.job_id)
        return 1.0 if full is None else r.spec.gpu_count / full

    def hidden(self, claims: Mapping[str, object]) -> set[str]:
        """The online jobs waiting for a lend now (those whose claim is over forgotten)."""
        self.claimants.intersection_update(claims)
        return self.claimants

    def resizing(self, job_id: str) -> bool:
        return job_id in self.pending

    def ended(self, job_id: str) -> None:
        """It finished, failed or was lost: a resize in flight is void."""
        self.pending.pop(job_id, None)

    def full_size(self, r: JobRecord) -> None:
        """Back in the queue (preempted, lost): it waits for its declared size again."""
        full = self.declared.get(r.job_id)
        if full is not None and r.spec.gpu_count != full:
            r.spec = replace(r.spec, gpu_count=full)

    def forget(self, job_id: str) -> None:
        self.ended(job_id)
        self.declared.pop(job_id, None)
        self.last_s.pop(job_id, None)
        self.idle_since.pop(job_id, None)

    def restored(self, job: JobSpec, count: int) -> JobSpec:
        """A running elastic job found after a restart on `count` GPUs: the spec it runs as."""
        self.track(job)
        if job.elastic and job.gpu_count_min is not None and job.gpu_count_min <= count:
            return replace(job, gpu_count=min(count, job.gpu_count))
        return job

    def recover(self, core: Scheduler, job_id: str, placement: Placement, now: float) -> None:
        """A resize in flight when the driver restarted (the job restored on its old
        GPUs): carry on with it; a growth takes its new cards again at once."""
        r = core.records.get(job_id)
        if r is None or r.state is not JobState.RUNNING or job_id in self.pending:
            return
        old = r.spec.gpu_count
        if placement.gpu_count > old:
            current = core.state.placements[job_id]
            core.engine.release(job_id, now, "resize")
            grown = replace(r.spec, gpu_count=placement.gpu_count)
            try:
                core.engine.apply(grown, placement, now, "resize")
            except PlanRejected:  # its new cards are taken: it restarts where it was
                core.engine.apply(r.spec, current, now, "restore")
                placement = current
            else:
                r.spec = grown
                core.held[(r.spec.team, r.gpu_type)] += placement.gpu_count - old
        self.pending[job_id] = PendingResize(placement, old, ())
        self.last_s[job_id] = now
        core.dirty = True

    # ---- lending --------------------------------------------------------------------------
    def donors(self, core: Scheduler, pool: str) -> list[tuple[JobRecord, NodeShare]]:
        """Running elastic jobs of the pool, on one node, above their minimum, not resizing."""
        out = []
        for job_id in self.declared:
            r = core.running.get(job_id)
            if r is None or r.state is not JobState.RUNNING or job_id in self.pending:
                continue
            if r.gpu_type != pool or job_id in core.expiring:
                continue
            placement = core.state.placements.get(job_id)
            if placement is None or len(placement.shares) != 1:
                continue
            low = r.spec.gpu_count_min or r.spec.gpu_count
            if r.spec.gpu_count > low:
                out.append((r, placement.shares[0]))
        out.sort(key=lambda d: (d[0].spec.priority, -d[0].spec.gpu_count, d[0].job_id))
        return out

    def lend(self, core: Scheduler, now: float) -> list[Command]:
        """Shrink elastic jobs for online jobs that cannot be placed now."""
        if not self.enabled or not self.declared:
            return []
        online = [
            r
            for r in core.visible(now)
            if r.spec.kind is JobKind.ONLINE
            and r.job_id not in core.claims
            and r.job_id not in core.on_hold
            and r.spec.gpu_count == 1
        ]
        if not online:
            return []
        scratch = core.state.copy()
        shrunk: dict[str, list[int]] = {}
        """Each donor's GPUs after this pass."""
        delta: dict[tuple[str, str], int] = defaultdict(int)
        """GPUs each (team, pool) holds after this pass, less what it holds now."""
        lent_to: dict[str, list[str]] = defaultdict(list)
        given: dict[str, set[str]] = {}
        node_of: dict[str, int] = {}
        for r in online:
            allowed = core.pool_nodes[r.gpu_type].copy()
            if core.team_nodes is not None:
                allowed &= core.team_nodes[r.spec.team]
            plan = core.placement.place(scratch, r.spec, core.rng, allowed)
            if plan is not None:  # the policy places it (or something else holds it back)
                scratch.allocate(r.spec, plan)
                continue
            found = self._lend_one(core, scratch, r, allowed, shrunk, delta, now)
            if found is None:
                continue
            k, donor = found
            lent_to[donor].append(r.job_id)
            given[r.job_id] = {donor}
            node_of[r.job_id] = k
        out: list[Command] = []
        for donor, gpus in shrunk.items():
            d = core.records[donor]
            old = d.spec.gpu_count
            share = core.state.placements[donor].shares[0]
            placement = Placement((replace(share, gpus=tuple(sorted(gpus))),))
            takers = lent_to[donor]
            reason = (
                f"lent {plural(old - len(gpus), 'GPU')} to online job"
                f"{'s' if len(takers) > 1 else ''} {', '.join(takers)}: {old} -> {len(gpus)}"
            )
            out.append(self._begin(core, d, placement, tuple(takers), reason, now))
        ck = core.config.checkpoint
        for claimant, victims in given.items():
            self.claimants.add(claimant)
            core.claims[claimant] = victims
            core.claim_nodes[claimant] = (node_of[claimant],)
            # it starts once its donor's checkpoint is written (the donor then restarts)
            core.claim_grace[claimant] = max(
                ck.write_s(core.records[v].spec.state_gib_per_gpu) for v in victims
            )
        return out

    def _lend_one(
        self,
        core: Scheduler,
        scratch: ClusterState,
        r: JobRecord,
        allowed: BoolArray,
        shrunk: dict[str, list[int]],
        delta: dict[tuple[str, str], int],
        now: float,
    ) -> tuple[int, str] | None:
        """The node and donor that free a card for one online job (on scratch), within
        the online job's team maximum once the donor gave its card back."""
        key = (r.spec.team, r.gpu_type)
        limit = core.quotas.maximum(r.spec.team, r.gpu_type, now)
        for d, share in self.donors(core, r.gpu_type):
            donor_key = (d.spec.team, d.gpu_type)
            after = core.held[key] + delta[key] + 1 - (donor_key == key)
            if after > limit:
                continue  # its team would pass its maximum: lending would not start it
            k = share.node
            if not allowed[k] or k in core.drained or not core.healthy[k]:
                continue
            gpus = shrunk.get(d.job_id, list(share.gpus))
            low = d.spec.gpu_count_min or d.spec.gpu_count
            if len(gpus) <= low:
                continue
            give = gpus[-1]
            before = scratch.jobs[d.job_id]
            current = scratch.placements[d.job_id]
            # On scratch: the donor without that card, and the online job on it.
            scratch.release(d.job_id)
            keep = [g for g in gpus if g != give]
            scratch.allocate(replace(before, gpu_count=len(keep)), current_of(share, keep))
            mask = np.zeros_like(allowed)
            mask[k] = True
            plan = core.placement.place(scratch, r.spec, core.rng, mask)
            if plan is None or give not in plan.shares[0].gpus:
                # the card does not take it (sharing rules): undo and try the next donor
                scratch.release(d.job_id)
                scratch.allocate(before, current)
                continue
            scratch.allocate(r.spec, plan)
            shrunk[d.job_id] = keep
            delta[key] += 1
            delta[donor_key] -= 1
            return k, d.job_id
        return None

    def _begin(
        self,
        core: Scheduler,
        r: JobRecord,
        placement: Placement,
        lent_to: tuple[str, ...],
        reason: str,
        now: float,
    ) -> Resize:
        """Record a resize and what it takes from the team now (a shrink frees its cards
        only once done; a growth takes its new cards at once)."""
        job = r.spec
        old = job.gpu_count
        new = placement.gpu_count
        ck = core.config.checkpoint
        if new > old:
            core.engine.release(job.job_id, now, "resize")
            r.spec = replace(job, gpu_count=new)
            core.engine.apply(r.spec, placement, now, "resize")
            core.held[(job.team, r.gpu_type)] += new - old
        self.pending[job.job_id] = PendingResize(placement, old, lent_to)
        self.last_s[job.job_id] = now
        self.resizes += 1
        r.saved_s = r.done_s  # a resize checkpoints on demand: nothing is lost
        r.vacate_at = now + ck.write_s(job.state_gib_per_gpu)
        core.engine.note(job.job_id, now, f"resize ({reason})")
        core.dirty = True
        return Resize(job.job_id, placement, reason)

    # ---- growing back ---------------------------------------------------------------------
    def grow(self, core: Scheduler, now: float) -> list[Command]:
        """Elastic jobs below their size take idle cards of their node back, once their
        hold-down passed and no online job waits in their pool."""
        if not self.enabled or not self.declared:
            return []
        waiting_online = {
            core.records[job_id].gpu_type
            for queue in core.queues.by_team.values()
            for _, job_id in queue
            if core.records[job_id].spec.kind is JobKind.ONLINE
        }
        waiting_online.update(core.records[c].gpu_type for c in core.claims)
        out: list[Command] = []
        for job_id, full in sorted(self.declared.items()):
            r = core.running.get(job_id)
            if r is None or r.state is not JobState.RUNNING or job_id in self.pending:
                continue
            if r.spec.gpu_count >= full or r.gpu_type in waiting_online:
                self.idle_since.pop(job_id, None)
                continue
            if now - self.last_s.get(job_id, -1e18) < self.config.grow_after_s - 1e-9:
                continue
            placement = core.state.placements.get(job_id)
            if placement is None or len(placement.shares) != 1:
                continue
            share = placement.shares[0]
            k = share.node
            if k in core.drained or not core.healthy[k]:
                continue
            idle = [
                g
                for g in range(int(core.state.gpu_count[k]))
                if int(core.state.gpu_left[k, g]) == MILLI_PER_GPU and g not in share.gpus
            ]
            limit = core.quotas.maximum(r.spec.team, r.gpu_type, now)
            room = limit - core.held[(r.spec.team, r.gpu_type)]
            take = min(full - r.spec.gpu_count, len(idle), room)
            if take <= 0:
                self.idle_since.pop(job_id, None)
                continue
            since = self.idle_since.setdefault(job_id, now)
            if now - since < self.config.grow_after_s - 1e-9:
                continue  # cards idle only briefly: the peak may not have passed
            del self.idle_since[job_id]
            gpus = tuple(sorted(share.gpus + tuple(idle[:take])))
            old = r.spec.gpu_count
            reason = (
                f"grew back by {plural(take, 'GPU')} (no online job waits; cards idle for "
                f"{now - since:.0f}s): {old} -> {len(gpus)}"
            )
            out.append(self._begin(core, r, current_of(share, gpus), (), reason, now))
        return out

    # ---- done -----------------------------------------------------------------------------
    def resized(self, core: Scheduler, job_id: str, at: float) -> list[Command]:
        """Its processes left: it gives up its lent cards (the online jobs start there)
        and starts again on its new placement."""
        p = self.pending.pop(job_id, None)
        r = core.records.get(job_id)
        if p is None or r is None or r.state is not JobState.RUNNING:
            return []
        job = r.spec
        new = p.placement.gpu_count
        if new < job.gpu_count:
            core.engine.release(job_id, at, "resize")
            r.spec = replace(job, gpu_count=new)
            core.engine.apply(r.spec, p.placement, at, "resize")
            core.held[(job.team, r.gpu_type)] -= job.gpu_count - new
            core.room_since[(job.team, r.gpu_type)] = at
        ck = core.config.checkpoint
        r.vacate_at = None
        r.attempts += 1
        r.run_started_s = at
        r.overhead_s = ck.resume_s(r.spec.state_gib_per_gpu)
        r.speed = core.speed_of(r)
        r.start_done_s, r.start_overhead_s = r.done_s, r.overhead_s
        self.last_s[job_id] = at
        core.dirty = True
        note = f"resized {p.old_count} -> {new} GPUs"
        launch = Launch(job_id, p.placement, True, r.spec, r.service, note)
        return [launch, *core._wake_claims(job_id, at)]


def current_of(share: NodeShare, gpus: list[int] | tuple[int, ...]) -> Placement:
    return Placement((replace(share, gpus=tuple(sorted(gpus))),))
