"""Borrowing without interruption: elastic jobs lend GPUs to online work (ElasticLend,
before the policy would preempt anyone for it) and grow back once the online work left
(ElasticGrow, after the plan). The job book carries the resizes out and keeps their
bookkeeping (`scheduler/elastic.py`); these stages decide them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import ClassVar

import numpy as np

from gpupool.domain.engine import Engine
from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import MILLI_PER_GPU, JobKind, NodeShare, Placement
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.elastic import current_of, plural
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import JobRecord


class ElasticLend:
    """Reads `published.deferred` (as the plan does: a deferred online job waits anyway)."""

    name: ClassVar[str] = "elastic-lend"

    def __init__(self, book: JobBook, fleet: Fleet, engine: Engine) -> None:
        self.book = book
        self.fleet = fleet
        self.engine = engine
        self.elastic = book.elastic

    def donors(self, pool: str) -> list[tuple[JobRecord, NodeShare]]:
        """Running elastic jobs of the pool, on one node, above their minimum, not resizing."""
        out = []
        for job_id in self.elastic.declared:
            r = self.book.running.get(job_id)
            if r is None or r.state is not JobState.RUNNING or job_id in self.elastic.pending:
                continue
            if r.gpu_type != pool or job_id in self.book.expiring:
                continue
            placement = self.book.state.placements.get(job_id)
            if placement is None or len(placement.shares) != 1:
                continue
            low = r.spec.gpu_count_min or r.spec.gpu_count
            if r.spec.gpu_count > low:
                out.append((r, placement.shares[0]))
        out.sort(key=lambda d: (d[0].spec.priority, -d[0].spec.gpu_count, d[0].job_id))
        return out

    def run(self, ctx: CycleContext) -> list[Command]:
        """Shrink elastic jobs for online jobs that cannot be placed now."""
        now = ctx.now_s
        if not self.elastic.declared:
            return []
        if not self.elastic.enabled or not self.elastic.declared:
            return []
        online = [
            r
            for r in self.book.visible(now, ctx.published.deferred)
            if r.spec.kind is JobKind.ONLINE
            and r.job_id not in self.book.claims
            and r.job_id not in self.book.on_hold
            and r.spec.gpu_count == 1
        ]
        if not online:
            return []
        scratch = self.book.state.copy()
        shrunk: dict[str, list[int]] = {}
        """Each donor's GPUs after this pass."""
        delta: dict[tuple[str, str], int] = defaultdict(int)
        """GPUs each (team, pool) holds after this pass, less what it holds now."""
        lent_to: dict[str, list[str]] = defaultdict(list)
        given: dict[str, set[str]] = {}
        node_of: dict[str, int] = {}
        for r in online:
            allowed = self.fleet.pool_nodes[r.gpu_type].copy()
            if self.fleet.team_nodes is not None:
                allowed &= self.fleet.team_nodes[r.spec.team]
            plan = self.engine.policy.place(scratch, r.spec, self.engine.rng, allowed)
            if plan is not None:  # the policy places it (or something else holds it back)
                scratch.allocate(r.spec, plan)
                continue
            found = self.lend_one(scratch, r, allowed, shrunk, delta, now)
            if found is None:
                continue
            k, donor = found
            lent_to[donor].append(r.job_id)
            given[r.job_id] = {donor}
            node_of[r.job_id] = k
        out: list[Command] = []
        for donor, gpus in shrunk.items():
            d = self.book.records[donor]
            old = d.spec.gpu_count
            share = self.book.state.placements[donor].shares[0]
            placement = Placement((replace(share, gpus=tuple(sorted(gpus))),))
            takers = lent_to[donor]
            reason = (
                f"lent {plural(old - len(gpus), 'GPU')} to online job"
                f"{'s' if len(takers) > 1 else ''} {', '.join(takers)}: {old} -> {len(gpus)}"
            )
            out.append(self.book.begin_resize(d, placement, tuple(takers), reason, now))
        ck = self.book.config.checkpoint
        for claimant, victims in given.items():
            self.elastic.claimants.add(claimant)
            self.book.claims[claimant] = victims
            self.book.claim_nodes[claimant] = (node_of[claimant],)
            # it starts once its donor's checkpoint is written (the donor then restarts)
            self.book.claim_grace[claimant] = max(
                ck.write_s(self.book.records[v].spec.state_gib_per_gpu) for v in victims
            )
        return out

    @staticmethod
    def gathering(
        scratch: ClusterState, donors: list[tuple[JobRecord, NodeShare]]
    ) -> list[tuple[JobRecord, NodeShare]]:
        """Donors on the nodes holding the least other work first (at each priority): the
        replicas gather where replicas already are, and a node they have not reached
        stays whole for a wide job (replicas scattered over the cards many jobs lent
        leave a job that comes back a few free cards on every node and a node on none)."""
        others = (scratch.other_on_gpu > 0).sum(axis=1)
        return sorted(donors, key=lambda d: (d[0].spec.priority, int(others[d[1].node])))

    def lend_one(
        self,
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
        limit = self.book.quotas.maximum(r.spec.team, r.gpu_type, now)
        for d, share in self.gathering(scratch, self.donors(r.gpu_type)):
            donor_key = (d.spec.team, d.gpu_type)
            after = self.book.held[key] + delta[key] + 1 - (donor_key == key)
            if after > limit:
                continue  # its team would pass its maximum: lending would not start it
            k = share.node
            if not allowed[k] or k in self.fleet.drained or not self.fleet.healthy[k]:
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
            plan = self.engine.policy.place(scratch, r.spec, self.engine.rng, mask)
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


class ElasticGrow:
    name: ClassVar[str] = "elastic-grow"

    def __init__(self, book: JobBook, fleet: Fleet) -> None:
        self.book = book
        self.fleet = fleet
        self.elastic = book.elastic

    def run(self, ctx: CycleContext) -> list[Command]:
        """Elastic jobs below their size take idle cards of their node back, once their
        hold-down passed and no online job waits in their pool."""
        now = ctx.now_s
        if not self.elastic.declared:
            return []
        if not self.elastic.enabled or not self.elastic.declared:
            return []
        waiting_online = {
            self.book.records[job_id].gpu_type
            for queue in self.book.queues.by_team.values()
            for _, job_id in queue
            if self.book.records[job_id].spec.kind is JobKind.ONLINE
        }
        waiting_online.update(self.book.records[c].gpu_type for c in self.book.claims)
        out: list[Command] = []
        for job_id, full in sorted(self.elastic.declared.items()):
            r = self.book.running.get(job_id)
            if r is None or r.state is not JobState.RUNNING or job_id in self.elastic.pending:
                continue
            if r.spec.gpu_count >= full or r.gpu_type in waiting_online:
                self.elastic.idle_since.pop(job_id, None)
                continue
            if (
                now - self.elastic.last_s.get(job_id, -1e18)
                < self.elastic.config.grow_after_s - 1e-9
            ):
                continue
            placement = self.book.state.placements.get(job_id)
            if placement is None or len(placement.shares) != 1:
                continue
            share = placement.shares[0]
            k = share.node
            if k in self.fleet.drained or not self.fleet.healthy[k]:
                continue
            idle = [
                g
                for g in range(int(self.book.state.gpu_count[k]))
                if int(self.book.state.gpu_left[k, g]) == MILLI_PER_GPU and g not in share.gpus
            ]
            limit = self.book.quotas.maximum(r.spec.team, r.gpu_type, now)
            room = limit - self.book.held[(r.spec.team, r.gpu_type)]
            take = min(full - r.spec.gpu_count, len(idle), room)
            if take <= 0:
                self.elastic.idle_since.pop(job_id, None)
                continue
            since = self.elastic.idle_since.setdefault(job_id, now)
            if now - since < self.elastic.config.grow_after_s - 1e-9:
                continue  # cards idle only briefly: the peak may not have passed
            del self.elastic.idle_since[job_id]
            gpus = tuple(sorted(share.gpus + tuple(idle[:take])))
            old = r.spec.gpu_count
            reason = (
                f"grew back by {plural(take, 'GPU')} (no online job waits; cards idle for "
                f"{now - since:.0f}s): {old} -> {len(gpus)}"
            )
            out.append(self.book.begin_resize(r, current_of(share, gpus), (), reason, now))
        return out
