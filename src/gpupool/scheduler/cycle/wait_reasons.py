"""Why each waiting job does not start: a reason code and a sentence with numbers, like
Slurm's `Reason`.

Decided from the core's state after a cycle (no clock): the same events give the same
reasons under every driver. `explain` works out the reasons that may have changed (the
front of each pool's queue and the jobs that moved), `explain_all` every waiting job's;
the core emits a Wait command only when a job's reason changes (and a sentence whose
numbers merely moved at most once per `REFRESH_S`), so thousands of waiting jobs do not
turn into thousands of writes, or of computations, a cycle.

Codes, checked in this order (the first that holds is the reason):

* Held               on hold until released (`gpupool release`).
* WaitingForVictims  it preempted running jobs; they are writing their checkpoints.
* Deferred           held for cheaper power; it still starts before its deadline.
* JobLimit, CpuJobLimit  its team runs as many (CPU-only) jobs as its limit allows.
* Window, QuotaMax   its team holds its maximum of the pool (a time window's or the
                     team's own).
* Reserved           GPUs are kept for it from a time worked out from the running jobs'
                     ends; jobs behind it use them only where they end before
                     (`draining`: some of them stand idle for it now).
* Priority           jobs ahead of it (higher priority, or earlier) wait for the same pool.
* Resources          no node has room for it now (the numbers: what it needs, the largest
                     free block, the pool's free GPUs).
* Reserve            it fits, but only in GPUs kept for online inference.
* Scheduling         it fits the free GPUs and is considered again at the next cycle.

The live driver adds DiskFull, ReadOnly, DiskUnknown and LaunchFailing (the launch
gate), and Unplaceable for a job no pool can ever run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, JobKind
from gpupool.domain.state import ClusterState
from gpupool.policies.contract import Reservation
from gpupool.policies.placement.domains import roomiest_domain
from gpupool.policies.preemption import may_hold_reserve
from gpupool.scheduler.book import JobBook, JobWatcher
from gpupool.scheduler.commands import Command, Wait
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext, Published
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import WAITING, JobRecord
from gpupool.scheduler.ordering import CoreLearning
from gpupool.scheduler.view import reserve_holders


@dataclass(frozen=True)
class WaitInputs:
    """What the reasons are worked out from: read only."""

    config: SchedulerConfig
    book: JobBook
    fleet: Fleet
    ordering: CoreLearning | None
    published: Published


REFRESH_S = 60.0
"""A reason whose code is unchanged but whose numbers moved is told again at most this often."""
DRAINING = ", draining"
"""How a Reserved reason ends while GPUs stand idle for the job: told at once when it comes
or goes (the rest of a sentence with an unchanged code, only once per REFRESH_S)."""


CODES = (
    "Held",
    "WaitingForVictims",
    "Deferred",
    "JobLimit",
    "CpuJobLimit",
    "Window",
    "QuotaMax",
    "Reserved",
    "Priority",
    "Resources",
    "Reserve",
    "Scheduling",
    "Unplaceable",
    "DiskFull",
    "ReadOnly",
    "DiskUnknown",
    "LaunchFailing",
)

_CODED = re.compile(r"^([A-Z][A-Za-z]+): (.*)$", re.DOTALL)


@dataclass(frozen=True)
class WaitReason:
    code: str
    sentence: str

    @property
    def text(self) -> str:
        """How a driver stores it: `Code: sentence`."""
        return f"{self.code}: {self.sentence}"


def split_reason(text: str) -> tuple[str, str]:
    """`Resources: needs 4 ...` -> ("Resources", "needs 4 ..."); a reason without a code
    -> ("", text)."""
    m = _CODED.match(text or "")
    if m is not None and m.group(1) in CODES:
        return m.group(1), m.group(2)
    if (text or "").startswith("deferred until "):  # a Defer's own words (local time)
        return "Deferred", text
    return "", text or ""


def reason_code(reason: str, waiting: bool, held: bool) -> str:
    """The code a job's stored reason carries: Held for a held waiting job, else the
    reason's own code (a waiting job's, or Unplaceable for one no pool can run)."""
    if held and waiting:
        return "Held"
    code, _ = split_reason(reason)
    return code if waiting or code == "Unplaceable" else ""


def clock_text(t_s: float) -> str:
    """A time of day, HH:MM UTC (a live core's times are Unix seconds)."""
    minutes = int(t_s // 60) % (24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d} UTC"


def _ids(ids: list[str], most: int = 3) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _gpus(n: int, model: str) -> str:
    return f"{n} {model} GPU{'s' if n != 1 else ''}"


class _Pools:
    """Free capacity per pool (and team island), computed once per explanation."""

    def __init__(self, core: WaitInputs) -> None:
        self.core = core
        self.masks: dict[tuple[str, str], np.ndarray] = {}
        self.fitting: dict[tuple[object, ...], bool] = {}
        holders = reserve_holders(core.book, core.fleet.pool_nodes, core.fleet.reserve_now())
        self.online_held: Mapping[str, int] = holders.online
        self.fast_held: Mapping[str, int] = holders.fast

    def allowed(self, r: JobRecord) -> np.ndarray:
        core = self.core
        team = r.spec.team if core.fleet.team_nodes is not None else ""
        key = (r.gpu_type, team)
        mask = self.masks.get(key)
        if mask is None:
            mask = core.fleet.pool_nodes[r.gpu_type].copy()
            if core.fleet.team_nodes is not None:
                mask &= core.fleet.team_nodes.get(team, np.zeros_like(mask))
            self.masks[key] = mask
        return mask

    def fits(self, r: JobRecord) -> bool:
        job = r.spec
        key = (
            r.gpu_type,
            job.team if self.core.fleet.team_nodes is not None else "",
            job.gpu_count,
            job.gpu_milli,
            job.kind is JobKind.ONLINE,
            job.cpu_milli,
            job.mem_mib,
        )
        hit = self.fitting.get(key)
        if hit is None:
            state = self.core.book.state
            allowed = self.allowed(r)
            width = state.max_gpus_per_node
            if job.gpu_count > width and job.gpu_milli == MILLI_PER_GPU:
                full, rest = divmod(job.gpu_count, width)
                idle = _idle_nodes(state, allowed)
                others = allowed & ~idle
                hit = int(idle.sum()) >= full and (
                    rest == 0
                    or int(idle.sum()) > full
                    or bool((state.whole_free[others] >= rest).any())
                )
                if hit and job.topology is not None and state.topology.placing:
                    hit = roomiest_domain(state, job.topology, allowed) >= full
            else:
                hit = bool((state.fits_mask(job) & allowed).any())
            self.fitting[key] = hit
        return hit


def _front(core: WaitInputs) -> dict[str, tuple[int, str]]:
    """The first `queue_depth` competing jobs of each pool (of each team's nodes in
    static mode), each with how many wait ahead of it for its pool and the first of
    them. Deferred jobs do not compete (they wait for a price)."""
    depth = core.config.queue_depth
    deferred = core.published.deferred
    groups = (
        core.book.queues.by_team if core.fleet.team_nodes is not None else core.book.queues.by_pool
    )
    one_pool = core.fleet.team_nodes is None or len(core.fleet.pool_nodes) == 1
    out: dict[str, tuple[int, str]] = {}
    rank = core.published.rank  # an ordered policy's order at its last plan (None: the queue's)
    for queue in groups.values():
        if rank is not None:
            last = len(rank)
            queue = sorted(queue, key=lambda e: rank.get(e[1], last))
        seen: dict[str, int] = {}
        head: dict[str, str] = {}
        for _, job_id in queue:
            if job_id in deferred:
                continue
            pool = core.book.records[job_id].gpu_type
            ahead = seen.get(pool, 0)
            if ahead >= depth:
                if one_pool:
                    break
                continue  # a team's queue in static mode: its other pools come later
            head.setdefault(pool, job_id)
            out[job_id] = (ahead, head[pool])
            seen[pool] = ahead + 1
    return out


def explain(core: WaitInputs, now: float, front_before: set[str]) -> dict[str, WaitReason]:
    """The reasons that may have changed since the last call: every job in the front of
    its pool's queue (the first `queue_depth`), claimants, deferred jobs, jobs that joined
    a queue and jobs that left the front (`front_before`). A job further back waits with
    Priority, behind at least `queue_depth` jobs: true until it reaches the front, so it
    is worked out once, not every cycle (thousands of waiting jobs cost nothing a cycle)."""
    front = _front(core)
    todo = set(front) | core.book.queues.entered | front_before | set(core.book.claims)
    todo |= core.published.deferred
    core.book.queues.entered = set()
    front_before.clear()
    front_before.update(front)
    pools = _Pools(core)
    counts = core.book.running_counts() if core.config.team_limits else {}
    out: dict[str, WaitReason] = {}
    for job_id in sorted(todo):
        r = core.book.active.get(job_id)
        if r is None or r.state not in WAITING or job_id in core.book.on_hold:
            continue
        out[job_id] = _reason_at(core, r, now, pools, counts, front.get(job_id))
    return out


def explain_all(core: WaitInputs, now: float) -> dict[str, WaitReason]:
    """The reason of every waiting job, held ones included (reports and tests)."""
    front = _front(core)
    pools = _Pools(core)
    counts = core.book.running_counts() if core.config.team_limits else {}
    out: dict[str, WaitReason] = {}
    for job_id, r in core.book.active.items():
        if r.state not in WAITING:
            continue
        if job_id in core.book.on_hold:
            out[job_id] = WaitReason("Held", f"on hold; `gpupool release {job_id}` lets it start")
            continue
        out[job_id] = _reason_at(core, r, now, pools, counts, front.get(job_id))
    return out


def _reason_at(
    core: WaitInputs,
    r: JobRecord,
    now: float,
    pools: _Pools,
    counts: Mapping[str, tuple[int, int]],
    place: tuple[int, str] | None,
) -> WaitReason:
    """A job's reason given its place at the front of its queue (None: further back, and
    neither claiming victims nor deferred: it waits behind at least queue_depth jobs)."""
    job_id = r.job_id
    if place is None and job_id not in core.book.claims and job_id not in core.published.deferred:
        depth = core.config.queue_depth
        return WaitReason("Priority", _behind(core, r, depth, None, exact=False))
    return _reason(core, r, now, pools, counts, place or (0, job_id))


def _behind(core: WaitInputs, r: JobRecord, ahead: int, head: str | None, exact: bool) -> str:
    model = core.fleet.pool_model.get(r.gpu_type, r.gpu_type)
    where = f"the {model} pool" + (
        f" in team {r.spec.team}'s nodes" if core.fleet.team_nodes is not None else ""
    )
    many = f"{ahead} waiting job{'s' if ahead != 1 else ''}"
    first = f" (first: {head})" if head is not None else ""
    why = "waiting longer"
    if core.ordering is not None:  # an ordered policy: its order, not age, within a class
        why = f"ahead in the {core.config.policy} order"
    return (
        f"behind {many if exact else 'at least ' + many} for {where} "
        f"with higher priority or {why}{first}"
    )


def _reason(
    core: WaitInputs,
    r: JobRecord,
    now: float,
    pools: _Pools,
    counts: Mapping[str, tuple[int, int]],
    place: tuple[int, str],
) -> WaitReason:
    job = r.spec
    job_id = r.job_id
    pool = r.gpu_type
    model = core.fleet.pool_model.get(pool, pool)
    victims = core.book.claims.get(job_id)
    if victims:
        ids = sorted(victims)
        eta = core.book.claim_eta_s(job_id)
        by = f"; expected by {clock_text(eta)}" if eta is not None else ""
        if all(core.book.elastic.resizing(v) for v in ids):
            return WaitReason(
                "WaitingForVictims",
                f"{len(ids)} elastic job{'s' if len(ids) != 1 else ''} ({_ids(ids)}) "
                f"{'are' if len(ids) != 1 else 'is'} giving back GPUs (checkpoint, restart "
                f"on fewer){by}",
            )
        return WaitReason(
            "WaitingForVictims",
            f"{len(ids)} preempted job{'s' if len(ids) != 1 else ''} ({_ids(ids)}) "
            f"{'are' if len(ids) != 1 else 'is'} writing checkpoints to make room{by}",
        )
    if job_id in core.published.deferred:
        until = core.published.deferred_until.get(job_id, now)
        return WaitReason(
            "Deferred",
            f"price: held for cheaper power until {clock_text(until)}; "
            "it still starts before its deadline",
        )
    if counts:
        why = core.book.limit_reason(r, counts)
        if why:
            code = "CpuJobLimit" if "CPU-only" in why else "JobLimit"
            return WaitReason(code, why)
    team = job.team
    if job.gpu_count > 0:
        held = core.book.usage(team, pool)
        maximum = core.book.quotas.maximum(team, pool, now)
        window = core.book.quotas.window(now)
        limited = team in core.book.quotas.teams or (
            window is not None and team in window.max_share
        )
        if limited and held + job.gpu_count > maximum:
            numbers = (
                f"team {team} holds {held} of its maximum of {_gpus(maximum, model)}; "
                f"this job needs {job.gpu_count}"
            )
            if window is not None and team in window.max_share:
                span = f"{clock_text(window.start_s)}-{clock_text(window.end_s)}"
                return WaitReason("Window", f"the {span} time window caps it: {numbers}")
            return WaitReason("QuotaMax", numbers)
    reserved = core.book.reservations.get(job_id)
    if reserved is not None:
        return WaitReason("Reserved", _reserved(core, reserved, model))
    ahead, head = place
    fits = job.gpu_count == 0 or pools.fits(r)
    if ahead > 0 and not (fits and _reserve_blocks(core, r, pools, now)):
        return WaitReason("Priority", _behind(core, r, ahead, head, exact=True))
    if not fits:
        return WaitReason("Resources", _resources(core, r, pools, model))
    if _reserve_blocks(core, r, pools, now):
        reserve = core.fleet.reserve.get(pool, 0)
        return WaitReason(
            "Reserve",
            f"it fits only in the {_gpus(reserve, model)} kept for online inference "
            "(the reserve); batch work may use them only if it can vacate within a cycle",
        )
    return WaitReason(
        "Scheduling", "it fits the free GPUs now; it is considered again at the next cycle"
    )


def _reserved(core: WaitInputs, reserved: Reservation, model: str) -> str:
    """`8 A100-80GB GPUs on a3 from 14:20, draining`: the GPUs kept for it, and whether
    some of them stand idle for it now."""
    names = [core.fleet.cluster.nodes[n].name for n in reserved.nodes]
    when = (
        "when the jobs on them end (no end is known)"
        if math.isinf(reserved.start_s)
        else f"from {clock_text(reserved.start_s)}"
    )
    draining = DRAINING if reserved.idle else ""
    return f"{_gpus(len(reserved.gpus), model)} on {', '.join(names)} {when}{draining}"


def _resources(core: WaitInputs, r: JobRecord, pools: _Pools, model: str) -> str:
    job = r.spec
    state = core.book.state
    allowed = pools.allowed(r)
    failed = [why for (k, _), why in sorted(core.fleet.gpu_down_why.items()) if bool(allowed[k])]
    usable = int(state.gpu_count[allowed].sum()) - len(failed)
    free = state.whole_free[allowed]
    block = int(free.max()) if free.size else 0
    total = int(free.sum())
    if job.gpu_milli < MILLI_PER_GPU:
        share = state.gpu_left[allowed]
        room = state.usable_gpus(job)[allowed]
        most = int(share[room].max()) if room.any() else 0
        refused = state.pair_refusals(job, allowed)
        kept = (
            f"; the co-location admission keeps it off {len(refused)} with room: {refused[0]}"
            if refused
            else ""
        )
        return (
            f"needs {job.gpu_milli / MILLI_PER_GPU:g} of one {model} GPU; the most free on "
            f"a GPU it may share is {most / MILLI_PER_GPU:g} ({total} {model} GPUs wholly "
            f"free){kept}"
        )
    if job.gpu_count > usable:
        mine = " in its team's nodes" if core.fleet.team_nodes is not None else ""
        out = [
            why
            for k, why in sorted(core.fleet.down_why.items())
            if core.fleet.node_pool[k] == r.gpu_type
        ]
        out += [
            f"node {core.fleet.cluster.nodes[k].name} drained"
            for k in sorted(core.fleet.drained)
            if core.fleet.node_pool[k] == r.gpu_type and k not in core.fleet.down_why
        ]
        out += failed
        gone = f" ({'; '.join(out[:3])}{'; ...' if len(out) > 3 else ''})" if out else ""
        return (
            f"needs {_gpus(job.gpu_count, model)}; only {usable} are up and not drained{mine}{gone}"
        )
    width = state.max_gpus_per_node
    if job.gpu_count > width:
        full, rest = divmod(job.gpu_count, width)
        idle = int(_idle_nodes(state, allowed).sum())
        more = f" and {rest} on one more node" if rest else ""
        level = job.topology
        if level is not None and state.topology.placing:
            if level not in state.topology.levels:
                return (
                    f"requires one {level} (--topology {level}), but the fleet has no "
                    f"topology level {level!r} (levels: {', '.join(state.topology.levels)}); "
                    "resubmit with one of them, or without --topology"
                )
            most = roomiest_domain(state, level, allowed)
            return (
                f"needs {_gpus(job.gpu_count, model)} inside one {level} (--topology "
                f"{level}): {full} idle {width}-GPU nodes{more} there; the most idle in any "
                f"{level} is {most} ({idle} idle nodes in the pool; it waits rather than spread)"
            )
        return (
            f"needs {_gpus(job.gpu_count, model)} across nodes: {full} idle {width}-GPU "
            f"nodes{more}; {idle} nodes are idle ({total} GPUs free in the pool)"
        )
    if block >= job.gpu_count:  # GPUs are free, the node lacks CPU or memory
        return (
            f"needs {_gpus(job.gpu_count, model)} with {job.cpu_milli / 1000:g} CPUs and "
            f"{job.mem_mib} MiB memory; no node with {job.gpu_count} free GPUs has that left"
        )
    failing = f"; out of service: {'; '.join(failed[:3])}" if failed else ""
    return (
        f"needs {_gpus(job.gpu_count, model)} on one node, largest free block "
        f"{block} ({total} free in the pool){failing}"
    )


def _idle_nodes(state: ClusterState, allowed: np.ndarray) -> np.ndarray:
    """Allowed nodes with every GPU free: what a job wider than a node needs."""
    mask: np.ndarray = allowed & state.idle_nodes()
    return mask


def _reserve_blocks(core: WaitInputs, r: JobRecord, pools: _Pools, now: float) -> bool:
    """The priority-quota policy keeps the online reserve for online inference: a
    borrowing batch job that could not leave it at once for an online arrival may not take
    it (the policy's own rule, policies.cycle.may_hold_reserve)."""
    job = r.spec
    if core.config.policy != "priority-quota" or job.kind is JobKind.ONLINE or not job.gpu_count:
        return False
    pool = r.gpu_type
    needed = core.fleet.reserve_now().get(pool, 0) - pools.online_held[pool]
    if needed <= 0:
        return False
    vacate_s = core.config.checkpoint.write_s(job.state_gib_per_gpu)
    rules, cycle_s = core.config.preemption, core.config.cycle_s
    if may_hold_reserve(rules, cycle_s, job, vacate_s, r.preemptions):
        return False
    if core.book.usage(job.team, pool) + job.gpu_count <= core.book.quotas.guaranteed(
        job.team, pool, now
    ):
        return False  # within its guarantee: the reserve does not hold it back
    mask = core.fleet.pool_nodes[pool]
    idle = int((core.book.state.gpu_left[mask] == MILLI_PER_GPU).sum())
    return idle - job.gpu_count + pools.fast_held[pool] < needed


class WaitReasons(JobWatcher):
    """Wait for each waiting job whose reason changed (`explain`); a changed sentence under
    the same code at most once per REFRESH_S. Held jobs are not told: their hold says why.
    Reads `published.changed` (PolicyPlan), `published.deferred` and `published.rank`."""

    name: ClassVar[str] = "wait-reasons"

    def __init__(
        self,
        config: SchedulerConfig,
        book: JobBook,
        fleet: Fleet,
        ordering: CoreLearning | None,
        published: Published,
    ) -> None:
        self.inputs = WaitInputs(config, book, fleet, ordering, published)
        self.told: dict[str, tuple[str, str, float]] = {}
        """The reason each waiting job was last given (Wait): code, sentence, when."""
        self.due = True
        """Something changed since the waiting jobs' reasons were last worked out."""
        self.front: set[str] = set()
        """The jobs at the front of their queues when reasons were last worked out."""
        book.watchers.append(self)

    def started(self, r: JobRecord, first: bool) -> None:
        self.told.pop(r.job_id, None)  # running: its Launch says so

    def ended(self, job_id: str) -> None:
        self.told.pop(job_id, None)

    def held(self, job_id: str) -> None:
        self.told.pop(job_id, None)

    def explain_all(self, now: float) -> dict[str, WaitReason]:
        return explain_all(self.inputs, now)

    def run(self, ctx: CycleContext) -> list[Command]:
        now = ctx.now_s
        self.due = self.due or ctx.published.changed
        if not self.due:
            return []
        self.due = False
        reasons = explain(self.inputs, now, self.front)
        out: list[Command] = []
        told = self.told
        for job_id, why in reasons.items():
            last = told.get(job_id)
            if last is not None and last[0] == why.code:
                if last[1] == why.sentence:
                    continue
                drains = last[1].endswith(DRAINING) != why.sentence.endswith(DRAINING)
                if now - last[2] < REFRESH_S - 1e-9 and not drains:
                    self.due = True  # its numbers moved: told once the refresh is due
                    continue
            out.append(Wait(job_id, why.sentence, why.code))
            told[job_id] = (why.code, why.sentence, now)
        if self.due:  # a refresh is due: those jobs are looked at again then
            self.front.update(j for j, w in reasons.items() if told[j][1] != w.sentence)
        return out
