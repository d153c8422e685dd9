"""priority-quota: online inference first (never preempted; reclaims by preemption), then
jobs within their team's guarantee (reclaiming borrowed GPUs by preemption), then borrowing
by fair share; EASY backfill around the first blocked job; the online reserve stays
available within one cycle."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Set

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, Placement
from gpupool.domain.state import ClusterState
from gpupool.policies.contract import (
    Claim,
    Command,
    CyclePolicy,
    CycleView,
    PendingView,
    Preempt,
    Start,
)
from gpupool.policies.cycle.easy import backfills, over_maximum, shadow, team_milli
from gpupool.policies.cycle.reservations import Reservations
from gpupool.policies.preemption import may_hold_reserve
from gpupool.policies.registry import register


class PriorityQuotaPolicy(CyclePolicy):
    name = "priority-quota"
    orders_by_rank = True

    def class_order(self, view: CycleView) -> Callable[[PendingView], tuple[object, ...]]:
        """The order inside a priority class: the core's rank where it gives one (fair
        share inside a team, an ordered policy's order), else oldest ready first."""
        rank = view.rank
        if rank is None:
            return lambda p: (p.ready_s, p.spec.job_id)
        last = len(rank)
        return lambda p: (rank.get(p.spec.job_id, last), p.ready_s, p.spec.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        scratch = view.state.copy()
        running_usage = view.usage_after_lends()
        usage = dict(running_usage)
        for p in view.pending:  # a job waiting on its victims already counts for its team
            if p.spec.job_id in view.claimed:
                key = (p.spec.team, p.gpu_type)
                usage[key] = usage.get(key, 0) + p.spec.gpu_count
        commands: list[Command] = []
        taken: set[str] = set()  # victims already chosen this cycle
        # GPUs each team holds above its guarantee: what reclaim may take from it.
        excess = {
            key: held - view.quotas.guaranteed(key[0], key[1], view.now_s)
            for key, held in running_usage.items()
        }
        held = {t: np.zeros(view.state.node_count, dtype=np.bool_) for t in view.pool_nodes}
        # Reservations of specific GPUs (view.reservations), or one EASY reservation per
        # pool (`shadows`, below).
        reservations = Reservations(view, scratch) if view.reservations else None

        def start(job: JobSpec, gpu_type: str, plan: Placement) -> None:
            scratch.allocate(job, plan)
            if reservations is not None:
                reservations.started(job, gpu_type, plan)
            commands.append(Start(job.job_id, plan))
            key = (job.team, gpu_type)
            usage[key] = usage.get(key, 0) + job.gpu_count

        orphans: set[str] = set()

        def reclaim(
            job: JobSpec,
            gpu_type: str,
            own_team: bool = False,
            by_rank: bool = False,
            min_gpus: int = 0,
        ) -> bool:
            """Preempt the cheapest victims that make room for `job`: borrowers (to give
            its team its guarantee back), its own team's batch work (online inference
            short of unguaranteed room), or, by_rank, borrowing work it outranks."""
            victims = self._victims(
                view,
                scratch,
                job,
                gpu_type,
                taken,
                excess,
                job.team if own_team else None,
                orphans,
                job if by_rank else None,
            )
            if victims is None:
                return False
            nodes, chosen = victims
            if sum(view.running[v].spec.gpu_count for v, _ in chosen) < min_gpus:
                return False  # its team would still be past its maximum
            for v, via_reclaim in chosen:
                taken.add(v)
                if v in orphans:
                    continue  # already leaving: claimed, not preempted again
                r = view.running[v]
                if via_reclaim:
                    excess[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
                commands.append(
                    Preempt(
                        v,
                        f"{'preempted' if by_rank else 'reclaimed'} for {job.job_id} "
                        f"({job.kind.value})",
                        via_reclaim and not by_rank,
                        job.team if own_team and not via_reclaim and not by_rank else None,
                        job.job_id if by_rank else None,
                    )
                )
            chosen_ids = [v for v, _ in chosen]
            commands.append(Claim(job.job_id, tuple(chosen_ids), tuple(sorted(nodes))))
            held[gpu_type][list(nodes)] = True
            key = (job.team, gpu_type)
            usage[key] = usage.get(key, 0) + job.gpu_count
            return True

        # A job waiting for its victims' checkpoints takes GPUs that freed up meanwhile,
        # before a borrower can (its team already counts them in `usage`).
        held_by = dict(view.claims)
        for p in view.pending:
            if p.spec.job_id in view.claimed:
                plan = view.placement.place(
                    scratch, p.spec, view.rng, view.allowed(p.spec, p.gpu_type)
                )
                if plan is not None:
                    scratch.allocate(p.spec, plan)
                    commands.append(Start(p.spec.job_id, plan))
                    held_by.pop(p.spec.job_id, None)
        # Victims whose claimant started elsewhere still leave: their GPUs go to the next
        # entitled job that claims them (no second preemption), not to a borrower.
        orphans.update(view.vacating - frozenset().union(*held_by.values()))
        waiting = [p for p in view.pending if p.spec.job_id not in view.claimed]
        online_held = dict(view.reserve_holders().online_all)
        # Within each team, online first, then by priority and age; what fits inside the
        # team's guarantee is entitled (and may reclaim), the rest borrows by fair share.
        tail = self.class_order(view)
        boost = view.priority_boost

        def priority(p: PendingView) -> int:
            return p.spec.priority + boost.get(p.spec.job_id, 0) if boost else p.spec.priority

        waiting.sort(key=lambda p: (p.spec.kind is not JobKind.ONLINE, -priority(p), *tail(p)))
        entitled: list[PendingView] = []
        borrowing: list[PendingView] = []
        planned = dict(usage)
        for p in waiting:
            key = (p.spec.team, p.gpu_type)
            guaranteed = view.quotas.guaranteed(p.spec.team, p.gpu_type, view.now_s)
            batch = p.spec.kind is not JobKind.ONLINE
            if planned.get(key, 0) + p.spec.gpu_count <= guaranteed and (
                reservations is None or not batch or reservations.quota_allows(p.spec, p.gpu_type)
            ):
                planned[key] = planned.get(key, 0) + p.spec.gpu_count
                entitled.append(p)
                continue
            if reservations is not None and batch and p.spec.gpu_count <= guaranteed:
                # The first of its team's jobs that its guarantee cannot hold now but will
                # once the team's jobs end: the team's jobs behind it take that room only
                # if they leave it in time (else a wide job is overtaken forever).
                ahead = [e.spec for e in entitled if (e.spec.team, e.gpu_type) == key]
                reservations.hold_quota(
                    p.spec, p.gpu_type, planned.get(key, 0), guaranteed, ahead, p.ready_s
                )
            borrowing.append(p)

        def aged_first(p: PendingView) -> tuple[bool, float]:
            # With reservations, a job that has waited past the age bound borrows (and
            # reserves) before the fair-share order, oldest first: an order that moves with
            # the teams' use would hand its drained GPUs to another job every cycle.
            if reservations is None or not reservations.aged(p.spec, p.ready_s):
                return (True, 0.0)
            return (False, p.ready_s)

        borrowing.sort(
            key=lambda p: (
                p.spec.kind is not JobKind.ONLINE,
                *aged_first(p),
                view.quotas.fair_rank(p.spec.team),
                -priority(p),
                *tail(p),
            )
        )
        fast_held = self._fast_held(view)
        by_priority = view.rules.by_priority
        shadows: dict[str, tuple[float, int] | None] = {}
        # The scratch state only fills up while planning: once a shape fails to fit in a
        # set of nodes, anything at least as big fails there too.
        failed: dict[tuple[object, ...], int] = {}
        for within, group in ((True, entitled), (False, borrowing)):
            for p in group:
                job, t = p.spec, p.gpu_type
                online = job.kind is JobKind.ONLINE
                shape = (
                    t,
                    job.team if view.team_nodes is not None else "",
                    job.gpu_milli,
                    job.kind is JobKind.ONLINE,
                    job.cpu_milli // max(1, job.gpu_count),
                    job.mem_mib // max(1, job.gpu_count),
                    job.gpu_models,
                )
                if (
                    job.gpu_count >= failed.get(shape, 1 << 30)
                    and not within
                    and not online
                    and not by_priority
                    and (reservations is None or not reservations.made)
                ):
                    # A borrowing batch job has no other way in than free GPUs (or, where
                    # GPUs are reserved, those it would leave before their reservation).
                    continue
                at_max = over_maximum(view, scratch, usage, job, t)
                if at_max and (
                    reservations is None
                    or reservations.capped(t, view.quotas.maximum(job.team, t, view.now_s))
                ):
                    # At its team's maximum: a whole-GPU job may only take the place of
                    # its own team's work that it outranks (preempting others would take
                    # it past).
                    over = (
                        usage.get((job.team, t), 0)
                        + job.gpu_count
                        - view.quotas.maximum(job.team, t, view.now_s)
                    )
                    if (
                        (online or by_priority)
                        and not job.shares_gpu
                        and over > 0
                        and reclaim(job, t, own_team=True, by_rank=True, min_gpus=over)
                        and online
                    ):
                        online_held[t] += job.gpu_count
                    if reservations is not None and not online:
                        limit = view.quotas.maximum(job.team, t, view.now_s)
                        held_now = usage.get((job.team, t), 0)
                        reservations.hold_quota(job, t, held_now, limit, ready_s=p.ready_s)
                    continue
                if (
                    reservations is not None
                    and not online
                    and not within  # an entitled job was asked when the queue was classified
                    and not reservations.quota_allows(job, t, p.ready_s)
                ):
                    continue  # its team's room is kept for a job of the team ahead of it
                if (
                    not within
                    and p.preemptions >= view.rules.max_per_job
                    and not self._unguaranteed_room(view, usage, job, t, scratch)
                ):
                    # Preempted enough: nothing may preempt it again, so like online work
                    # it borrows only capacity no other team is guaranteed.
                    continue
                if (
                    online
                    and not within
                    and not self._unguaranteed_room(view, usage, job, t, scratch)
                ):
                    # No capacity nobody is guaranteed: it may still displace its own
                    # team's batch work, which changes no other team's share.
                    if reclaim(job, t, own_team=True):
                        online_held[t] += job.gpu_count
                    continue
                if (
                    not online
                    and not within
                    and not self._reserve_ok(view, scratch, p, online_held[t], fast_held)
                ):
                    continue  # borrowing must leave the online reserve quick to free
                allowed = view.allowed(job, t, held[t])
                if at_max:  # at a maximum as big as the pool: it waits for GPUs, reserved
                    if reservations is not None and not online:
                        reservations.reserve(job, t, p.ready_s, allowed)
                    continue
                plan = view.placement.place(scratch, job, view.rng, allowed)
                if reservations is None and plan is not None and not online:
                    ok, shadows[t] = backfills(view, job, shadows.get(t))
                    if not ok:
                        continue
                if plan is None and reservations is not None and reservations.made:
                    plan = reservations.place_before(job, t, allowed, view.rng, overrides=online)
                if plan is not None:
                    start(job, t, plan)
                    if online:
                        online_held[t] += job.gpu_count
                    elif self._can_vacate(view, job, p.vacate_s, p.preemptions):
                        fast_held[t] += job.gpu_count
                    continue
                if not held[t].any():
                    failed[shape] = min(failed.get(shape, 1 << 30), job.gpu_count)
                if within and reclaim(job, t):
                    if online:
                        online_held[t] += job.gpu_count
                    continue
                # Not entitled: it may still displace borrowing work it outranks (online
                # inference always, when it cannot otherwise start; the rest if enabled).
                if not within and (online or by_priority) and reclaim(job, t, by_rank=True):
                    if online:
                        online_held[t] += job.gpu_count
                    continue
                if reservations is not None:
                    if not online:
                        reservations.reserve(job, t, p.ready_s, allowed)
                elif shadows.get(t) is None:
                    shadows[t] = shadow(view, scratch, job, t)
        return commands

    @staticmethod
    def _unguaranteed_room(
        view: CycleView,
        usage: Mapping[tuple[str, str], int],
        job: JobSpec,
        gpu_type: str,
        scratch: ClusterState | None = None,
    ) -> bool:
        """Online inference is never preempted, so it borrows only capacity no other team
        is guaranteed: otherwise that team could not get its guarantee back."""
        others = sum(
            view.quotas.guaranteed(team, gpu_type, view.now_s)
            for team in view.quotas.teams
            if team != job.team
        )
        total = int(view.state.gpu_count[view.pool_nodes[gpu_type]].sum())
        if job.shares_gpu and scratch is not None:  # a share counts as its part of a GPU
            room = (total - others) * 1000
            return team_milli(view, scratch, job.team, gpu_type) + job.gpu_milli <= room
        return usage.get((job.team, gpu_type), 0) + job.gpu_count <= total - others

    @staticmethod
    def _can_vacate(view: CycleView, job: JobSpec, vacate_s: float, preemptions: int) -> bool:
        return may_hold_reserve(view.rules, view.cycle_s, job, vacate_s, preemptions)

    def _fast_held(self, view: CycleView) -> dict[str, int]:
        """GPUs of each pool held by work that could vacate the reserve in time; only a
        pool with a reserve asks (`_reserve_ok`), so without one nothing is counted."""
        if not any(view.reserve.values()):
            return {t: 0 for t in view.pool_nodes}
        return dict(view.reserve_holders().fast)

    def _reserve_ok(
        self,
        view: CycleView,
        scratch: ClusterState,
        p: PendingView,
        online_held: int,
        fast_held: dict[str, int],
    ) -> bool:
        """The online reserve must stay idle or held by jobs that vacate within its bound
        (preemption.reserve_vacate_s, else a cycle) and that an online job may preempt."""
        needed = view.reserve.get(p.gpu_type, 0) - online_held
        if needed <= 0 or self._can_vacate(view, p.spec, p.vacate_s, p.preemptions):
            return True
        pool = view.pool_nodes[p.gpu_type]
        idle = int((scratch.gpu_left[pool] == 1000).sum())
        return idle - p.spec.gpu_count + fast_held[p.gpu_type] >= needed

    def _victims(
        self,
        view: CycleView,
        scratch: ClusterState,
        job: JobSpec,
        gpu_type: str,
        taken: set[str],
        excess: dict[tuple[str, str], int],
        team: str | None = None,
        orphans: Set[str] = frozenset(),
        claimant: JobSpec | None = None,
    ) -> tuple[set[int], list[tuple[str, bool]]] | None:
        """Cheapest set of borrowed jobs whose GPUs, with idle ones, make room for `job`.

        A victim's team must hold GPUs above its guarantee; borrowed GPUs are reclaimable
        whatever their minimum runtime. Cheapest: lowest priority first,
        then least (lost work + checkpoint + resume) x GPUs. A job that fits in one node
        takes victims from one node (a victim spanning nodes leaves them all); a wider
        job takes whole nodes. Returns the nodes and (victim, reclaimed?) pairs.
        Orphans (leaving already, their claimant gone) come first and cost nothing.
        A victim that would lose more than preemption.max_lost_work_s is skipped. With a
        `claimant` (priority preemption) only borrowing jobs it outranks qualify, and,
        unless it is online inference, only once they ran their minimum runtime.
        """
        allowed = view.allowed(job, gpu_type)
        rules = view.rules
        bound = math.inf if rules.max_lost_work_s is None else rules.max_lost_work_s + 1e-9
        patient = claimant is not None and claimant.kind is not JobKind.ONLINE
        online = JobKind.ONLINE
        by_online = claimant is not None and claimant.kind is online
        above = math.inf if claimant is None or by_online else claimant.priority
        now_s, min_runtime_s = view.now_s, rules.min_runtime_s
        # Reclaiming for a job that fits in a node, a victim of a team not above its
        # guarantee is never admitted (admit below): not worth a look.
        teams: Set[str] | None = None
        if team is not None:
            teams = {team}
        elif job.gpu_count <= view.state.max_gpus_per_node:
            teams = {t for (t, pool), n in excess.items() if pool == gpu_type and n > 0}

        def admit(job_id: str, left: dict[tuple[str, str], int]) -> bool | None:
            """True if its team still holds GPUs above its guarantee (a job straddling the
            line goes whole: its team then waits with less room than the job needs)."""
            if job_id in orphans:
                return True
            r = view.running[job_id]
            key = (r.spec.team, r.gpu_type)
            if left.get(key, 0) > 0:
                left[key] = left.get(key, 0) - r.spec.gpu_count
                return True
            if team is not None:
                return False  # its own team's batch work, displaced by its online inference
            return None

        width = view.state.max_gpus_per_node
        if job.gpu_count <= width:
            # One node: the node whose cheapest sufficient victims score least (worst
            # priority, then total cost), the earliest in the running order on a tie.
            # Nodes are visited by floor (VictimTable.by_floor), so the search stops at
            # the first node that cannot beat the best, having scored only those before.
            table = view.victim_table(gpu_type)
            whole_free = scratch.whole_free
            jobs = table.jobs
            best: tuple[tuple[float, float], int, int, list[tuple[str, bool]]] | None = None
            for floor_p, floor_c, first, row in table.by_floor(job.gpu_count):
                if best is not None and ((floor_p, floor_c), first) > best[:2]:
                    break
                node = table.node_of(row)
                if not allowed[node]:
                    continue
                cands: list[tuple[tuple[float, float], str, int, str, int]] = []
                seq = -1
                for e_seq, k, gpus in table.shares_of(row):
                    e_key, job_id, e_team, lost, started, leaving, count, _, _ = jobs[k]
                    orphan = job_id in orphans
                    if (
                        job_id in taken
                        or (teams is not None and e_team not in teams and not orphan)
                        or (team is not None and e_team != team)
                        or (leaving and not orphan)
                    ):
                        continue
                    if not orphan and (
                        lost > bound
                        or e_key[0] >= above
                        or (patient and now_s - started < min_runtime_s)
                    ):
                        continue
                    if seq < 0:
                        seq = e_seq
                    cands.append(
                        ((-math.inf, 0.0) if orphan else e_key, job_id, gpus, e_team, count)
                    )
                if not cands:
                    continue
                free = int(whole_free[node])
                left = dict(excess)
                chosen: list[tuple[str, bool]] = []
                worst: tuple[float, float] = (0.0, 0.0)
                total = 0.0
                for c_key, job_id, gpus, e_team, count in sorted(cands):
                    if free >= job.gpu_count:
                        break
                    # admit, read from the table (no view made)
                    if job_id in orphans:
                        via = True
                    elif left.get((e_team, gpu_type), 0) > 0:
                        left[(e_team, gpu_type)] -= count
                        via = True
                    elif team is not None:
                        via = False
                    else:
                        continue
                    chosen.append((job_id, via))
                    free += gpus
                    worst = max(worst, c_key)
                    total += c_key[1]
                if free >= job.gpu_count and chosen:
                    score = (worst[0], total)
                    if best is None or (score, seq) < best[:2]:
                        best = (score, seq, node, chosen)
            return None if best is None else ({best[2]}, best[3])
        # the loop below visits every running job of the pool: its tests are written out
        # flat (no property, no call)
        max_per_job = rules.max_per_job
        vacating = view.vacating
        placements = view.state.placements
        by_node: dict[int, list[tuple[tuple[float, float], str, int]]] = {}
        for job_id, r in view.batch_in(gpu_type, teams, orphans):
            spec = r.spec
            if (
                r.gpu_type != gpu_type
                or spec.kind is online
                or r.preemptions >= max_per_job
                or job_id in taken
                or (team is not None and spec.team != team)
                or (job_id in vacating and job_id not in orphans)
            ):
                continue
            if job_id not in orphans and (
                r.lost_work_s > bound
                or spec.priority >= above
                or (patient and now_s - r.run_started_s < min_runtime_s)
            ):
                continue
            placement = placements.get(job_id)
            if placement is None:
                continue
            key: tuple[float, float] = (
                (-math.inf, 0.0)
                if job_id in orphans
                else (r.spec.priority, (r.lost_work_s + r.vacate_s + r.resume_s) * r.spec.gpu_count)
            )
            for share in placement.shares:
                by_node.setdefault(share.node, []).append((key, job_id, len(share.gpus)))

        # Wider than a node: whole nodes, every job on them a victim.
        need_nodes = -(-job.gpu_count // width)
        options: list[tuple[tuple[float, float], int, list[str]]] = []
        for node in np.flatnonzero(allowed).tolist():
            items = by_node.get(node, [])
            if int(scratch.whole_free[node]) + sum(g for _, _, g in items) < width:
                continue
            node_cost: tuple[float, float] = (
                max((k[0] for k, _, _ in items), default=0.0),
                float(sum(k[1] for k, _, _ in items)),
            )
            options.append((node_cost, node, [j for _, j, _ in items]))
        options.sort()
        left = dict(excess)
        picked: set[int] = set()
        victims: dict[str, bool] = {}
        for _, node, node_victims in options:
            trial = dict(left)
            how_all: dict[str, bool] = {}
            for job_id in node_victims:
                if job_id in victims:
                    continue
                how = admit(job_id, trial)
                if how is None:
                    break
                how_all[job_id] = how
            else:
                left = trial
                victims.update(how_all)
                picked.add(node)
                if len(picked) == need_nodes:
                    break
        if len(picked) < need_nodes or not victims:
            return None
        # In the order admitted: a victim that takes its team below its guarantee (the
        # last one admitted for that team) comes after the others the core checks first.
        return picked, list(victims.items())


register("cycle", "priority-quota")(PriorityQuotaPolicy)
