"""A victim search for a job that fits one node reads a VictimTable and visits nodes by
their floor, stopping at the first that cannot beat the best. These tests hold it to the
plain search it replaced (every candidate scored, node by node, in the running order)
over random fleets: ties in cost, several priorities, orphans, vacating jobs, taken
victims, teams at and above their guarantee, free GPUs used up while planning."""

from __future__ import annotations

import math
from collections.abc import Set

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node, NodeShare, Placement
from gpupool.domain.quota import QuotaBook
from gpupool.domain.state import ClusterState
from gpupool.policies.contract import CycleView
from gpupool.policies.cycle.priority_quota import PriorityQuotaPolicy
from gpupool.policies.preemption import PreemptionRules
from gpupool.policies.victims import RunningView, victim_table

WIDTH = 8
TEAMS = ("t0", "t1", "t2")


def plain_search(
    view: CycleView,
    scratch: ClusterState,
    job: JobSpec,
    gpu_type: str,
    taken: Set[str],
    excess: dict[tuple[str, str], int],
    team: str | None,
    orphans: Set[str],
    claimant: JobSpec | None,
) -> tuple[set[int], list[tuple[str, bool]]] | None:
    """The search as it was: every candidate scored, nodes in order of first appearance."""
    allowed = view.allowed(job, gpu_type)
    rules = view.rules
    bound = math.inf if rules.max_lost_work_s is None else rules.max_lost_work_s + 1e-9
    patient = claimant is not None and claimant.kind is not JobKind.ONLINE
    by_online = claimant is not None and claimant.kind is JobKind.ONLINE
    above = math.inf if claimant is None or by_online else claimant.priority
    teams = (
        {team}
        if team is not None
        else {t for (t, pool), n in excess.items() if pool == gpu_type and n > 0}
    )
    by_node: dict[int, list[tuple[tuple[float, float], str, int]]] = {}
    for job_id, r in view.running.items():
        spec = r.spec
        if (
            r.gpu_type != gpu_type
            or spec.kind is JobKind.ONLINE
            or not (spec.team in teams or job_id in orphans)
            or r.preemptions >= rules.max_per_job
            or job_id in taken
            or (team is not None and spec.team != team)
            or (job_id in view.vacating and job_id not in orphans)
        ):
            continue
        if job_id not in orphans and (
            r.lost_work_s > bound
            or spec.priority >= above
            or (patient and view.now_s - r.run_started_s < rules.min_runtime_s)
        ):
            continue
        placement = view.state.placements.get(job_id)
        if placement is None:
            continue
        key = (
            (-math.inf, 0.0)
            if job_id in orphans
            else (spec.priority, (r.lost_work_s + r.vacate_s + r.resume_s) * spec.gpu_count)
        )
        for share in placement.shares:
            by_node.setdefault(share.node, []).append((key, job_id, len(share.gpus)))

    def admit(job_id: str, left: dict[tuple[str, str], int]) -> bool | None:
        if job_id in orphans:
            return True
        r = view.running[job_id]
        key = (r.spec.team, r.gpu_type)
        if left.get(key, 0) > 0:
            left[key] = left.get(key, 0) - r.spec.gpu_count
            return True
        return False if team is not None else None

    best: tuple[tuple[float, float], int, list[tuple[str, bool]]] | None = None
    for node, items in by_node.items():
        if not allowed[node]:
            continue
        free = int(scratch.whole_free[node])
        left = dict(excess)
        chosen: list[tuple[str, bool]] = []
        worst: tuple[float, float] = (0.0, 0.0)
        total = 0.0
        for key, job_id, gpus in sorted(items):
            if free >= job.gpu_count:
                break
            how = admit(job_id, left)
            if how is None:
                continue
            chosen.append((job_id, how))
            free += gpus
            worst = max(worst, key)
            total += key[1]
        if free >= job.gpu_count and chosen:
            score = (worst[0], total)
            if best is None or score < best[0]:
                best = (score, node, chosen)
    return None if best is None else ({best[1]}, best[2])


# Few distinct values, so that many nodes tie (the running order decides) and sums of
# tenths round (the floors leave a margin for it).
job_draw = st.tuples(
    st.sampled_from([1, 1, 2, 4, 8]),  # GPUs
    st.sampled_from(TEAMS),
    st.sampled_from([0, 0, 0, 1, -1]),  # priority
    st.sampled_from([10.0] * 6 + [0.1, 0.2, 0.30000000000000004, 2_000.0]),  # lost work
    st.sampled_from([0.0] * 4 + [2.5]),  # checkpoint write
    st.sampled_from([5.0] * 4 + [0.0]),  # resume
    st.sampled_from([0, 0, 1, 3]),  # preemptions
    st.sampled_from([0.0, 0.0, 950.0]),  # started
    st.sampled_from(["training"] * 3 + ["online", "vacating", "orphan", "taken", "taken"]),
)


@settings(max_examples=500, deadline=None)
@given(
    nodes=st.integers(1, 12),
    jobs=st.lists(job_draw, min_size=0, max_size=60),
    wide=st.lists(st.integers(0, 11), max_size=2),
    excess=st.tuples(*(st.integers(-2, 6) for _ in TEAMS)),
    need=st.integers(1, WIDTH),
    claim=st.sampled_from(["reclaim", "own-team", "online", "priority-1", "priority-2"]),
    used=st.lists(st.integers(0, 11), max_size=3),
    bound=st.sampled_from([None, 100.0]),
    order=st.randoms(use_true_random=False),
)
def test_the_table_search_chooses_as_the_plain_search(
    nodes: int,
    jobs: list[tuple[int, str, int, float, float, float, int, float, str]],
    wide: list[int],
    excess: tuple[int, ...],
    need: int,
    claim: str,
    used: list[int],
    bound: float | None,
    order: object,
) -> None:
    cluster = Cluster(
        "c", tuple(Node(f"n{i}", "H100", WIDTH, 1 << 20, 1 << 30) for i in range(nodes))
    )
    state = ClusterState(cluster)
    running: dict[str, RunningView] = {}
    vacating: set[str] = set()
    orphans: set[str] = set()
    taken: set[str] = set()

    def put(job_id: str, spec: JobSpec, draw: tuple[object, ...], shares: list[NodeShare]) -> None:
        _, _, _, lost, vacate, resume, preempted, started, what = draw
        state.allocate(spec, Placement(tuple(shares)))
        running[job_id] = RunningView(
            spec,
            "H100",
            float(started),
            int(preempted),
            float(vacate),
            float(lost),  # type: ignore[arg-type]
            float(resume),
            0.0,  # type: ignore[arg-type]
        )
        if what in ("vacating", "orphan"):
            vacating.add(job_id)
        if what == "orphan":
            orphans.add(job_id)
        if what == "taken":
            taken.add(job_id)

    # jobs spanning two whole nodes first, then the rest where they fit
    for k, first in enumerate(wide):
        if first + 1 < nodes and all(state.whole_free[n] == WIDTH for n in (first, first + 1)):
            draw = (16, TEAMS[k % 3], 0, 10.0, 0.0, 5.0, 0, 0.0, "training")
            spec = JobSpec(f"w{k}", gpu_count=16, team=TEAMS[k % 3])
            put(
                spec.job_id,
                spec,
                draw,
                [NodeShare(n, tuple(range(WIDTH)), 16_000 // 2) for n in (first, first + 1)],
            )
    for k, draw in enumerate(jobs):
        gpus, team, priority, *_, what = draw
        node = next((n for n in range(nodes) if state.whole_free[n] >= gpus), None)
        if node is None:
            continue
        free = [g for g in range(WIDTH) if state.gpu_left[node, g] == 1000][:gpus]
        kind = JobKind.ONLINE if what == "online" else JobKind.TRAINING
        spec = JobSpec(f"j{k}", gpu_count=gpus, team=team, priority=priority, kind=kind)
        put(spec.job_id, spec, draw, [NodeShare(node, tuple(free), 1000 * gpus)])
    # the running jobs' order is not the nodes' order
    ids = list(running)
    order.shuffle(ids)  # type: ignore[attr-defined]
    running = {j: running[j] for j in ids}
    scratch = state.copy()
    for k, node in enumerate(used):  # free GPUs used up by this cycle's starts
        if node < nodes and scratch.whole_free[node] > 0:
            g = next(g for g in range(WIDTH) if scratch.gpu_left[node, g] == 1000)
            filler = JobSpec(f"s{k}", gpu_count=1, team="t0")
            scratch.allocate(filler, Placement((NodeShare(node, (g,), 1000),)))
    view = CycleView(
        now_s=1_000.0,
        cycle_s=60.0,
        state=state,
        running=running,
        pending=[],
        claimed=frozenset(),
        vacating=frozenset(vacating),
        quotas=QuotaBook((), {"H100": nodes * WIDTH}),
        pool_nodes={"H100": np.ones(nodes, dtype=np.bool_)},
        team_nodes=None,
        reserve={},
        rules=PreemptionRules(max_lost_work_s=bound),
        rng=np.random.default_rng(0),
    )
    claimant_team = "t1"
    team = claimant_team if claim in ("own-team", "online") else None
    claimant = None
    if claim.startswith("priority"):
        claimant = JobSpec("c", gpu_count=need, team=claimant_team, priority=int(claim[-1]))
    job = JobSpec(
        "c",
        gpu_count=need,
        team=claimant_team,
        kind=JobKind.ONLINE if claim == "online" else JobKind.TRAINING,
    )
    if claim == "online":
        claimant = job
        team = None
    left = {(t, "H100"): n for t, n in zip(TEAMS, excess, strict=True)}
    args = (view, scratch, job, "H100", taken, left, team, orphans, claimant)
    want = plain_search(*args)
    got = PriorityQuotaPolicy()._victims(*args)
    assert got == want


def test_the_table_lists_every_candidate_share_in_the_running_order() -> None:
    cluster = Cluster("c", tuple(Node(f"n{i}", "H100", WIDTH, 1 << 20, 1 << 30) for i in range(3)))
    state = ClusterState(cluster)
    running: dict[str, RunningView] = {}
    for k, (node, gpus, kind, preempted) in enumerate(
        [
            (2, 4, JobKind.TRAINING, 0),
            (0, 2, JobKind.ONLINE, 0),
            (0, 2, JobKind.TRAINING, 3),
            (0, 4, JobKind.TRAINING, 1),
            (1, 8, JobKind.TRAINING, 0),
            (2, 2, JobKind.TRAINING, 0),
        ]
    ):
        spec = JobSpec(f"j{k}", gpu_count=gpus, kind=kind, priority=k)
        left = [g for g in range(WIDTH) if state.gpu_left[node, g] == 1000][:gpus]
        state.allocate(spec, Placement((NodeShare(node, tuple(left), 1000 * gpus),)))
        running[spec.job_id] = RunningView(spec, "H100", 0.0, preempted, 1.0, 2.0, 3.0, 0.0)
    table = victim_table(running, "H100", state, {"j3"}, max_per_job=3)
    # online inference and a job preempted three times are never victims
    assert [j[1] for j in table.jobs] == ["j0", "j3", "j4", "j5"]
    floors = table.by_floor(1)
    nodes = [table.node_of(row) for *_, row in floors]
    assert nodes == [0, 2, 1]  # a vacating job's node first, then least priority
    assert [list(table.shares_of(row)) for *_, row in floors][1] == [(0, 0, 4), (3, 3, 2)]


def fleet(
    jobs: list[tuple[str, int, int, str]], lost_work_s: float = 10.0, resume_s: float = 5.0
) -> CycleView:
    """Full nodes of 8 GPUs; each job (id, node, GPUs, team) at priority 0, the same lost
    work and resume time: every GPU costs the same."""
    nodes = 1 + max(node for _, node, _, _ in jobs)
    cluster = Cluster(
        "c", tuple(Node(f"n{i}", "H100", WIDTH, 1 << 20, 1 << 30) for i in range(nodes))
    )
    state = ClusterState(cluster)
    running = {}
    for job_id, node, gpus, team in jobs:
        spec = JobSpec(job_id, gpu_count=gpus, team=team)
        left = [g for g in range(WIDTH) if state.gpu_left[node, g] == 1000][:gpus]
        state.allocate(spec, Placement((NodeShare(node, tuple(left), 1000 * gpus),)))
        running[job_id] = RunningView(spec, "H100", 0.0, 0, 0.0, lost_work_s, resume_s, 0.0)
    return CycleView(
        now_s=1_000.0,
        cycle_s=60.0,
        state=state,
        running=running,
        pending=[],
        claimed=frozenset(),
        vacating=frozenset(),
        quotas=QuotaBook((), {"H100": nodes * WIDTH}),
        pool_nodes={"H100": np.ones(nodes, dtype=np.bool_)},
        team_nodes=None,
        reserve={},
        rules=PreemptionRules(),
        rng=np.random.default_rng(0),
    )


def test_on_a_tie_the_node_first_in_the_running_order_gives_the_victims() -> None:
    # Node 1's floor is lower (a one-GPU job) but node 0 scores the same (two GPUs) and
    # its job runs first: the plain search takes node 0.
    view = fleet(
        [
            ("a", 0, 2, "t0"),
            ("b", 0, 6, "t0"),
            ("c", 1, 1, "t0"),
            ("d", 1, 1, "t0"),
            ("e", 1, 6, "t0"),
        ]
    )
    job = JobSpec("x", gpu_count=2, team="t1")
    args = (view, view.state.copy(), job, "H100", set(), {("t0", "H100"): 8}, None, set(), None)
    assert plain_search(*args) == ({0}, [("a", True)])
    assert PriorityQuotaPolicy()._victims(*args) == ({0}, [("a", True)])
    # with its first job taken, node 0 comes later in the order: node 1 gives them
    args = (view, view.state.copy(), job, "H100", {"a"}, {("t0", "H100"): 8}, None, set(), None)
    want = ({1}, [("c", True), ("d", True)])
    assert plain_search(*args) == want == PriorityQuotaPolicy()._victims(*args)


def test_a_team_leaves_no_victims_once_back_at_its_guarantee() -> None:
    # t0 holds one GPU above its guarantee: of node 0's two one-GPU jobs only the first
    # goes, so node 1's two-GPU job gives the room.
    view = fleet(
        [
            ("a", 0, 1, "t0"),
            ("b", 0, 1, "t0"),
            ("c", 0, 6, "t2"),
            ("d", 1, 2, "t1"),
            ("e", 1, 6, "t2"),
        ]
    )
    job = JobSpec("x", gpu_count=2, team="t2")
    excess = {("t0", "H100"): 1, ("t1", "H100"): 2}
    args = (view, view.state.copy(), job, "H100", set(), excess, None, set(), None)
    assert plain_search(*args) == ({1}, [("d", True)])
    assert PriorityQuotaPolicy()._victims(*args) == ({1}, [("d", True)])


@pytest.mark.parametrize("per_gpu_s", [0.1, 1.0 + 2.0**-51])
def test_a_sum_rounded_below_the_product_still_wins(per_gpu_s: float) -> None:
    # Eight one-GPU victims of node 1 sum (in floats) to less than the eight-GPU victim of
    # node 0 costs, though node 0 comes first and its floor is the same product: the floor
    # keeps a margin (0.1 is not exact in binary; 1 + 2**-51 is, but not its multiples).
    jobs = [("a", 0, 8, "t0")] + [(f"b{k}", 1, 1, "t0") for k in range(8)]
    view = fleet(jobs, lost_work_s=per_gpu_s, resume_s=0.0)
    assert sum([per_gpu_s] * 8) < per_gpu_s * 8
    job = JobSpec("x", gpu_count=8, team="t1")
    args = (view, view.state.copy(), job, "H100", set(), {("t0", "H100"): 16}, None, set(), None)
    want = ({1}, [(f"b{k}", True) for k in range(8)])
    assert plain_search(*args) == want
    assert PriorityQuotaPolicy()._victims(*args) == want
