"""GPU types by job class: each kind prefers its types, and never waits while another
type it may use idles, unless the job names its GPU model.

Core tests drive the decision core directly (the simulator and the service feed it the
same way); the live test runs a real `gpupool serve` on a fake A100 + H100 fleet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.errors import SpecError
from gpupool.policies.pool_choice import class_rankings, class_rules
from gpupool.scheduler.commands import Launch
from gpupool.scheduler.config import PlacementConfig, SchedulerConfig
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.scheduler.scheduler import Scheduler
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.planner import PlanRequest
from gpupool.sizing.shapes import get_shape
from service_proc import HTTP, Server, cli, wait_for

CATALOG = load_catalog()


def fleet(*models: str, gpus: int = 2) -> Cluster:
    return Cluster("c", tuple(Node(m, m, gpus, 1_000_000, 1 << 30) for m in models))


def core(cluster: Cluster, **kw: object) -> Scheduler:
    cfg = SchedulerConfig(cycle_s=1.0, online_reserve=0.0, **kw)  # type: ignore[arg-type]
    return Scheduler(cluster, cfg, catalog=CATALOG)


def job(
    job_id: str, kind: JobKind, gpus: int = 1, model: str | None = None, t: float = 0.0
) -> JobSpec:
    return JobSpec(
        job_id,
        gpus,
        gpu_models=frozenset({model}) if model else frozenset(),
        team="a",
        kind=kind,
        submit_s=t,
        duration_s=1000.0,
    )


def launched(commands: list[object]) -> dict[str, tuple[str, str]]:
    """job -> (GPU type it started on, the launch's note)."""
    return {
        c.job_id: ((c.spec.gpu_models and next(iter(c.spec.gpu_models))) or "", c.note)
        for c in commands
        if isinstance(c, Launch) and c.spec is not None
    }


def test_the_catalogue_rules_rank_types_for_each_kind() -> None:
    ranks = class_rankings(["A100-80GB", "H100", "H200", "RTX-4090"], CATALOG)
    assert ranks[JobKind.TRAINING].types[0] == "H100"  # fastest (H200 ties, H100 is cheaper)
    assert ranks[JobKind.OFFLINE].types[0] == "H200"  # most memory
    assert ranks[JobKind.ONLINE].types[0] == "RTX-4090"  # cheapest
    assert ranks[JobKind.BATCH].types[0] == "RTX-4090"
    assert set(class_rules()) == set(JobKind)


def test_configured_preferences_come_first_and_unknown_names_are_skipped() -> None:
    ranks = class_rankings(["A100-80GB", "H100"], CATALOG, {"training": ("NOPE", "A100-80GB")})
    assert ranks[JobKind.TRAINING].types == ("A100-80GB", "H100")
    assert ranks[JobKind.TRAINING].why("A100-80GB") == "configured"
    cfg = parse_scheduling({"placement": {"prefer": {"training": ["A100-80GB"]}}}, "x.yaml")
    assert cfg.placement.prefer == {"training": ("A100-80GB",)}
    with pytest.raises(SpecError, match=r"placement\.prefer"):
        parse_scheduling({"placement": {"prefer": {"training": "H100"}}}, "x.yaml")
    with pytest.raises(SpecError, match=r"placement\.prefer"):
        parse_scheduling({"placement": {"prefer": {"inference": ["H100"]}}}, "x.yaml")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (JobKind.TRAINING, "H100"),
        (JobKind.OFFLINE, "H200"),
        (JobKind.ONLINE, "A100-80GB"),
        (JobKind.BATCH, "A100-80GB"),
    ],
)
def test_each_kind_starts_on_its_preferred_type_when_all_idle(kind: JobKind, expected: str) -> None:
    s = core(fleet("A100-80GB", "H100", "H200"))
    s.submit(job("1", kind), 0.0)
    started = launched(s.cycle(0.0))
    assert started["1"][0] == expected
    assert started["1"][1] == f"GPU type {expected}: {kind.value} prefers {expected} " + (
        f"({class_rankings([expected], CATALOG)[kind].reads_as})"
    )


def test_a_job_never_waits_while_another_fitting_type_idles() -> None:
    s = core(fleet("A100-80GB", "H100"))
    s.submit(job("busy", JobKind.TRAINING, 2, "A100-80GB"), 0.0)
    assert launched(s.cycle(0.0))["busy"][0] == "A100-80GB"
    s.submit(job("b", JobKind.BATCH, t=1.0), 1.0)  # batch prefers the cheaper A100
    started = launched(s.cycle(1.0))
    assert started["b"] == (
        "H100",
        "GPU type H100: A100-80GB preferred (cheapest) but busy, H100 idle",
    )


def test_the_default_first_pool_choice_would_have_waited() -> None:
    """The failure the by-class choice fixes: `first` keeps the job on the busy A100s."""
    s = core(fleet("A100-80GB", "H100"), placement=PlacementConfig(gpu_type="first"))
    s.submit(job("busy", JobKind.TRAINING, 2, "A100-80GB"), 0.0)
    s.cycle(0.0)
    s.submit(job("b", JobKind.BATCH, t=1.0), 1.0)
    assert "b" not in launched(s.cycle(1.0))


def test_a_pinned_job_waits_for_its_model() -> None:
    s = core(fleet("A100-80GB", "H100"))
    s.submit(job("busy", JobKind.TRAINING, 2, "A100-80GB"), 0.0)
    s.cycle(0.0)
    s.submit(job("pinned", JobKind.BATCH, model="A100-80GB", t=1.0), 1.0)
    assert "pinned" not in launched(s.cycle(1.0))
    s.finished("busy", 2.0, JobState.FINISHED)
    started = launched(s.cycle(2.0))
    assert started["pinned"] == ("A100-80GB", "GPU type A100-80GB: pinned by the job (gpu_model)")


def test_with_nothing_free_it_waits_for_its_preferred_type_and_follows_the_first_free() -> None:
    s = core(fleet("A100-80GB", "H100"))
    s.submit(job("x", JobKind.TRAINING, 2, "A100-80GB"), 0.0)
    s.submit(job("y", JobKind.TRAINING, 2, "H100"), 0.0)
    s.cycle(0.0)
    s.submit(job("t", JobKind.TRAINING, t=1.0), 1.0)
    assert "t" not in launched(s.cycle(1.0))
    assert s.records["t"].gpu_type == "H100"  # waits for the fastest
    s.finished("x", 5.0, JobState.FINISHED)  # an A100 frees first
    assert launched(s.cycle(5.0))["t"][0] == "A100-80GB"


def test_a_type_the_team_may_not_use_more_of_does_not_count_as_idle() -> None:
    quota = TeamQuota("a", {}, {"H100": 0})
    s = core(fleet("A100-80GB", "H100"), teams=(quota,))
    s.submit(job("busy", JobKind.TRAINING, 2, "A100-80GB"), 0.0)
    s.cycle(0.0)
    s.submit(job("b", JobKind.BATCH, t=1.0), 1.0)
    assert "b" not in launched(s.cycle(1.0))


def test_a_sized_job_gets_its_count_on_its_kinds_type_and_its_plan_in_the_note() -> None:
    s = core(
        Cluster(
            "c",
            (Node("a", "A100-80GB", 4, 10**6, 1 << 30), Node("r", "RTX-4090", 8, 10**6, 1 << 30)),
        )
    )
    small = PlanRequest(get_shape("llama-3-8b"), context=2048, batch=8)
    big = PlanRequest(get_shape("llama-3-70b"), context=8192, batch=16)
    s.submit(job("8b", JobKind.BATCH), 0.0, sized=small)  # batch: the cheapest, the 4090
    s.submit(job("70b", JobKind.OFFLINE), 0.0, sized=big)
    started = {c.job_id: c for c in s.cycle(0.0) if isinstance(c, Launch)}
    assert started["8b"].spec is not None and started["8b"].spec.gpu_models == {"RTX-4090"}
    assert started["70b"].spec is not None and started["70b"].spec.gpu_count == 4
    assert (
        started["70b"].note
        == "plan 4 x A100-80GB (chosen), RTX-4090: does not fit within the counts tried"
    )
    assert started["8b"].note.startswith(
        "GPU type RTX-4090: batch prefers RTX-4090 (cheapest); plan "
    )


# ---- live: a real `gpupool serve` -----------------------------------------------------------
def _show(url: str, job_id: int) -> dict[str, object]:
    """The job as the API returns it (what `gpupool show --json` prints)."""
    shown: dict[str, object] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return shown


def test_live_a_job_without_a_gpu_model_starts_on_the_idle_h100(tmp_path: Path) -> None:
    srv = Server(
        tmp_path / "state", "--fake-gpus", "2xA100-80GB,2xH100", "--auth", "none", "--cycle", "0.2"
    ).start()
    try:
        url = srv.url
        busy = cli(
            url, "submit", "--team", "a", "--gpu-model", "A100-80GB", "--gpus", "2", "--json",
            "--", "sleep", "300",
        )  # fmt: skip
        assert busy.returncode == 0, busy.stderr
        busy_id = json.loads(busy.stdout)["id"]
        wait_for(lambda: _show(url, busy_id)["state"] == "running", 30, "the A100 job to run")
        out = cli(
            url, "submit", "--team", "a", "--kind", "batch", "--gpus", "1", "--json",
            "--", "sleep", "300",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["id"]
        wait_for(lambda: _show(url, job_id)["state"] == "running", 30, "the job to start")
        shown = _show(url, job_id)
        # One cycle is 0.2 s; the A100s stay busy for 300 s. The bound leaves room for a
        # loaded host and still tells starting now from waiting for an A100.
        assert float(shown["started_at"]) - float(shown["submitted_at"]) < 10  # type: ignore[arg-type]
        assert all("H100" in str(g["node"]) for g in shown["gpus"])  # type: ignore[attr-defined]
        assert "A100-80GB preferred (cheapest) but busy, H100 idle" in str(shown["reason"])
        text = cli(url, "show", str(job_id)).stdout
        assert "GPU type    H100: A100-80GB preferred (cheapest) but busy, H100 idle" in text
        for j in (busy_id, job_id):
            HTTP.post(f"{url}/v1/jobs/{j}/cancel", timeout=10)
    finally:
        srv.stop()
