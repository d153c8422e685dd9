"""The shared-inference scenario runs through the one core under each placement policy."""

from __future__ import annotations

from gpupool.domain.model import JobKind
from gpupool.scheduler import Scheduler
from gpupool.sim.scenario.sharing import SharingScenario, openb_run, run, workload
from gpupool.sizing.catalog import load_catalog

SMALL = SharingScenario(nodes=4, gpus_per_node=8, demand=1.0, seed=3)


def placements(policy: str) -> dict[str, object]:
    seen: list[Scheduler] = []
    original = Scheduler.cycle

    def cycle(self: Scheduler, now: float) -> list[object]:
        if not seen:
            seen.append(self)
        return original(self, now)  # type: ignore[return-value]

    Scheduler.cycle = cycle  # type: ignore[assignment,method-assign]
    try:
        run(SMALL, policy)
    finally:
        Scheduler.cycle = original  # type: ignore[method-assign]
    return dict(seen[0].state.placements)


def test_the_scenario_is_deterministic_and_every_policy_is_used() -> None:
    assert run(SMALL, "fgd") == run(SMALL, "fgd")
    by_policy = {p: placements(p) for p in ("consolidate", "best-fit", "fgd")}
    assert by_policy["fgd"] != by_policy["consolidate"]  # the configured policy decides


def test_online_shares_are_sized_by_memory_and_share_only_with_online() -> None:
    jobs = workload(SMALL, load_catalog())
    assert {j.kind for j in jobs if j.gpu_mem_mib is not None} == {JobKind.ONLINE}
    placed = placements("consolidate")
    kinds: dict[tuple[int, int], set[JobKind]] = {}
    spec = {j.job_id: j for j in jobs}
    for job_id, p in placed.items():
        for share in p.shares:  # type: ignore[attr-defined]
            for g in share.gpus:
                kinds.setdefault((share.node, g), set()).add(spec[job_id].kind)
    assert all(len(k) == 1 for k in kinds.values())


def test_on_the_openb_trace_fgd_leaves_fewer_unplaced_shares_than_consolidate() -> None:
    """Seed 0 of bench/sharing_placement.py's openb runs (bench/results/sharing_placement.md):
    at 120% demand consolidate strands more GPU-sharing tasks than FGD."""
    fgd = openb_run("fgd", seed=0, demand=1.2, node_stride=16)
    consolidate = openb_run("consolidate", seed=0, demand=1.2, node_stride=16)
    assert fgd.shares == consolidate.shares
    assert fgd.shares_unplaced < consolidate.shares_unplaced
