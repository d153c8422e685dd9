"""The running jobs as a cycle sees them, and the index a victim search reads: each pool's
possible victims by node, with a floor per node so a search scores a few nodes only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from typing import NamedTuple

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, NodeShare, Placement
from gpupool.domain.state import ClusterState, IntArray


class RunningView(NamedTuple):
    """A running job as a cycle sees it (a tuple: thousands are built per cycle)."""

    spec: JobSpec
    gpu_type: str
    run_started_s: float
    preemptions: int
    vacate_s: float
    """Checkpoint write time if preempted now."""
    lost_work_s: float
    """Work since the last checkpoint, lost if preempted now."""
    resume_s: float
    est_end_s: float


class ReserveHolders(NamedTuple):
    """GPUs of each pool that the online reserve rules count."""

    online_all: Mapping[str, int]
    """Held by online inference, vacating jobs included."""
    online: Mapping[str, int]
    """Held by online inference that is not vacating."""
    fast: Mapping[str, int]
    """Held by work (not vacating) that an online arrival may preempt and that writes its
    checkpoint within the reserve's bound (may_hold_reserve)."""


VictimRow = tuple[
    tuple[int, float], str, str, float, float, bool, int, float, tuple[NodeShare, ...]
]
"""A possible victim: key (priority, (lost work + checkpoint write + resume) x GPUs: the
cheapest first), id, team, lost work, last start, whether it is vacating, GPUs, cost per
GPU, its shares (a plain tuple: a cycle makes one per running job of the pool)."""


class VictimTable:
    """One pool's possible victims (batch work with preemptions left and a placement), made
    once per cycle, share by share in the running jobs' order, and each node's floor: a
    bound below any score a victim search can give the node. A search visits nodes by
    floor and stops at the first that cannot beat the best found, so it scores a few
    nodes instead of every running job; the floors are worked out in arrays."""

    def __init__(self, free: IntArray) -> None:
        self.jobs: list[VictimRow] = []
        self._free = free
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._gpus: list[int] = []
        self._orders: dict[int, list[tuple[float, float, int, int]]] = {}

    def add(
        self,
        job_id: str,
        spec: JobSpec,
        lost_work_s: float,
        vacate_s: float,
        resume_s: float,
        run_started_s: float,
        placement: Placement,
        vacating: bool,
    ) -> None:
        unit = lost_work_s + vacate_s + resume_s
        count = spec.gpu_count
        self.jobs.append(
            (
                (spec.priority, unit * count),
                job_id,
                spec.team,
                lost_work_s,
                run_started_s,
                vacating,
                count,
                unit,
                placement.shares,
            )
        )

    def _index(self) -> tuple[np.ndarray, ...]:
        """Shares grouped by node (each node's in the running order) and per node: least
        priority, least cost at that priority, least cost per GPU freed, whether a
        vacating job is there (an orphan costs nothing), and its first share's place."""
        if self._arrays is None:
            jobs = self.jobs
            node = np.array([sh.node for row in jobs for sh in row[8]], dtype=np.int64)
            job = np.array([k for k, row in enumerate(jobs) for _ in row[8]], dtype=np.int64)
            self._gpus = [len(sh.gpus) for row in jobs for sh in row[8]]
            gpus = np.array(self._gpus, dtype=np.float64)
            prio = np.array([row[0][0] for row in jobs], dtype=np.float64)[job]
            prio[np.abs(prio) >= 2.0**53] = -np.inf  # not exact as a float: no bound
            cost = np.array([row[0][1] for row in jobs], dtype=np.float64)[job]
            leaving = np.array([row[5] for row in jobs], dtype=np.bool_)[job]
            count = np.array([row[6] for row in jobs], dtype=np.float64)[job]
            unit = np.array([row[7] for row in jobs], dtype=np.float64)[job]
            # a share of a job over several nodes frees fewer GPUs than the job's cost counts
            per_gpu = np.where(gpus <= count, unit, unit * count / np.maximum(gpus, 1.0))
            size = int(node.max()) + 1 if len(node) else 0
            by_node = np.argsort(node, kind="stable")
            nodes, starts = np.unique(node[by_node], return_index=True)
            p_min = np.full(size, np.inf)
            np.minimum.at(p_min, node, prio)
            at_min = prio == p_min[node]
            c_min = np.full(size, np.inf)
            np.minimum.at(c_min, node[at_min], cost[at_min])
            u_min = np.full(size, np.inf)
            np.minimum.at(u_min, node, per_gpu)
            vac = np.zeros(size, dtype=np.bool_)
            np.logical_or.at(vac, node, leaving)
            # the largest multiple of the least cost per GPU a sum may reach: a victim's
            # GPUs, or all GPUs freed on the node (-1: a share wider than its job)
            widest = np.zeros(size)
            np.add.at(widest, node, gpus)
            np.maximum.at(widest, node, count)
            irregular = np.zeros(size, dtype=np.bool_)
            np.logical_or.at(irregular, node, gpus > count)
            widest[irregular] = -1.0
            first = np.full(size, len(node), dtype=np.int64)
            np.minimum.at(first, node, np.arange(len(node), dtype=np.int64))
            self._arrays = (
                nodes,
                np.append(starts, len(node)),
                by_node,
                job,
                p_min[nodes],
                c_min[nodes],
                u_min[nodes],
                vac[nodes],
                first[nodes],
                _exact_multiples(u_min[nodes], widest[nodes]),
            )
        return self._arrays

    def by_floor(self, need: int) -> list[tuple[float, float, int, int]]:
        """(floor priority, floor cost, first place in the running order, node's row) of
        every node for a job of `need` GPUs, least first. A node's score is (worst
        priority, total cost) of the victims that make room: at least its least priority
        and, at that priority, its least cost and the GPUs still missing times its least
        cost per GPU (less a margin for the sum's rounding, unless the sums are exact:
        _exact_multiples; free GPUs only shrink while a plan is made, so those at the
        cycle's start bound it)."""
        order = self._orders.get(need)
        if order is None:
            nodes, _, _, _, p_min, c_min, u_min, vac, first, exact = self._index()
            missing = need - self._free[nodes]
            margin = np.where(exact, 1.0, 1.0 - 1e-9)
            floor_c = np.where(missing > 0, np.maximum(c_min, missing * u_min * margin), c_min)
            floor_c[u_min < 0.0] = -np.inf  # a negative cost (saved ahead of done): no bound
            floor_p = np.where(vac, -np.inf, p_min)
            floor_c[vac] = 0.0
            rows = np.lexsort((first, floor_c, floor_p))
            order = list(
                zip(
                    floor_p[rows].tolist(),
                    floor_c[rows].tolist(),
                    first[rows].tolist(),
                    rows.tolist(),
                    strict=True,
                )
            )
            self._orders[need] = order
        return order

    def node_of(self, row: int) -> int:
        return int(self._index()[0][row])

    def shares_of(self, row: int) -> Iterator[tuple[int, int, int]]:
        """(place in the running order, job index, GPUs freed) of each share on the node
        of `row`, in the running order."""
        _, starts, by_node, job, *_ = self._index()
        gpus = self._gpus
        for i in by_node[starts[row] : starts[row + 1]].tolist():
            yield i, int(job[i]), gpus[i]


def _exact_multiples(per_gpu: np.ndarray, widest: np.ndarray) -> np.ndarray:
    """Whether every multiple of `per_gpu` up to `widest` times is a float exactly (few
    enough significant bits). Then a node's victims cost at least those multiples and
    their float sum is at least the GPUs freed times `per_gpu`, rounding and all, so the
    floor needs no margin and nodes that tie on it are told apart by the running order
    alone (jobs started together cost the same: many nodes tie)."""
    finite = np.isfinite(per_gpu) & (per_gpu >= 0.0)
    mantissa, _ = np.frexp(np.where(finite, per_gpu, 0.0))
    bits = (mantissa * 2.0**53).astype(np.int64)
    low = bits & -bits  # the lowest bit set: trailing zeros are its log2
    trailing = np.where(bits == 0, 53, np.log2(np.maximum(low, 1)).astype(np.int64))
    needed = np.ceil(np.log2(np.maximum(widest, 1.0) + 1.0)).astype(np.int64)
    exact: np.ndarray = finite & (widest >= 0.0) & ((53 - trailing) + needed <= 53)
    return exact


def victim_table(
    running: Mapping[str, RunningView],
    gpu_type: str,
    state: ClusterState,
    vacating: Set[str],
    max_per_job: int,
) -> VictimTable:
    """A VictimTable made from running views (any mapping of them)."""
    table = VictimTable(state.whole_free)
    placements = state.placements
    for job_id, r in running.items():
        spec = r.spec
        if r.gpu_type != gpu_type or spec.kind is JobKind.ONLINE or r.preemptions >= max_per_job:
            continue
        placement = placements.get(job_id)
        if placement is not None:
            table.add(
                job_id,
                spec,
                r.lost_work_s,
                r.vacate_s,
                r.resume_s,
                r.run_started_s,
                placement,
                job_id in vacating,
            )
    return table
