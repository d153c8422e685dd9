"""Batch job generators: fine-tunes, a team's everyday mix, backlogs, one job given in
full, real jobs of an ITP cluster, and jobs given by a model (sized when submitted)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from gpupool.domain.model import JobKind, JobSpec
from gpupool.errors import SpecError
from gpupool.sim.scenario.generators.params import DAY_S, HOUR_S, GenContext, Params
from gpupool.sim.scenario.generators.traces import (
    ITP_RAW_DIR,
    PHILLY_MEAN_S,
    PHILLY_MEDIAN_S,
    PHILLY_RUNTIME,
    itp_jobs,
    lognormal_params,
    philly_runtimes,
    trace_file,
)
from gpupool.sim.scenario.workload import Workload


def _job_resources(p: Params) -> tuple[int, int]:
    return p.int_("cpu_milli_per_gpu", lo=0), p.int_("mem_mib_per_gpu", lo=0)


def finetune(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """`count` identical large training jobs (default: a 70B fine-tune on 64 GPUs), `gap_h`
    apart: the long, checkpoint-heavy job other work must fit around."""
    p = Params(params, "finetune")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    gpus, count = p.int_("gpus", lo=1), p.int_("count", lo=0)
    start_s, gap_s = p.num("start_h", lo=0) * HOUR_S, p.num("gap_h", lo=0) * HOUR_S
    work_s = p.num("work_h", lo=0) * HOUR_S
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)
    jobs = tuple(
        JobSpec(
            job_id=f"{name}-{i}",
            gpu_count=gpus,
            cpu_milli=cpu * gpus,
            mem_mib=mem * gpus,
            team=team,
            priority=priority,
            kind=JobKind.TRAINING,
            submit_s=start_s + i * gap_s,
            duration_s=work_s,
            checkpoint_interval_s=ckpt,
            state_gib_per_gpu=state,
        )
        for i in range(count)
    )
    return Workload(jobs=jobs)


def _work_samples(ctx: GenContext, rng: np.random.Generator, n: int) -> np.ndarray:
    """Work in seconds from Philly's empirical runtimes, or the lognormal fallback."""
    path = None if ctx.traces_dir is None else ctx.traces_dir / PHILLY_RUNTIME
    if path is not None and path.is_file():
        return rng.choice(philly_runtimes(path), size=n)
    mu, sigma = lognormal_params(PHILLY_MEDIAN_S, PHILLY_MEAN_S)
    return rng.lognormal(mu, sigma, size=n)


def _is_day(t_s: np.ndarray) -> np.ndarray:
    hour = (t_s % DAY_S) / HOUR_S
    return (hour >= 9.0) & (hour < 21.0)


def mixed(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """A team's everyday stream of training and offline-inference jobs.

    Arrivals: Poisson at jobs_per_day, times day_factor from 09:00 to 21:00 and night_factor
    otherwise (a homogeneous process at the higher rate, thinned). GPUs: drawn from
    gpu_choices/gpu_weights. Work: drawn from the measured Philly runtimes
    (philly/philly_runtime.csv) times duration_scale, clipped to [min_work_h, max_work_h]; if
    the file is unavailable, from a lognormal with Philly's median (1186 s) and mean
    (14,613 s), i.e. mu = ln 1186, sigma = sqrt(2 ln(14613/1186)) ≈ 2.24. An offline_share of
    the jobs are 1-GPU offline inference with work at most max_offline_work_h.
    """
    p = Params(params, "mixed")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    per_day = p.num("jobs_per_day", lo=0)
    f_day, f_night = p.num("day_factor", lo=0), p.num("night_factor", lo=0)
    start_s = p.num("start_h", lo=0) * HOUR_S
    end_s = p.num("end_h", lo=start_s / HOUR_S) * HOUR_S if p.given("end_h") else ctx.horizon_s
    if end_s < start_s:
        raise SpecError(
            f"generator 'mixed': start_h ({start_s / HOUR_S:g}) is past the scenario end "
            f"({end_s / HOUR_S:g} h); lower start_h or give end_h"
        )
    gpu_values, gpu_probs = p.choices("gpu_choices", "gpu_weights")
    if gpu_values.min() < 1:
        raise SpecError("generator 'mixed': gpu_choices must all be >= 1")
    scale = p.num("duration_scale", lo=0)
    min_work, max_work = p.num("min_work_h", lo=0), p.num("max_work_h", lo=0)
    max_off = p.num("max_offline_work_h", lo=0)
    if not min_work <= min(max_work, max_off):
        raise SpecError(
            "generator 'mixed': need min_work_h <= max_work_h and min_work_h <= max_offline_work_h"
        )
    offline_share = p.num("offline_share", lo=0, hi=1)
    s_min, s_max = p.num("state_gib_min", lo=0), p.num("state_gib_max", lo=0)
    if s_min > s_max:
        raise SpecError("generator 'mixed': need state_gib_min <= state_gib_max")
    ckpt = p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)

    f_max = max(f_day, f_night)
    lam_max = per_day / DAY_S * f_max
    n = int(rng.poisson(lam_max * (end_s - start_s)))
    times = np.sort(rng.uniform(start_s, end_s, size=n))
    accept = rng.random(n) * f_max < np.where(_is_day(times), f_day, f_night)
    times = times[accept]
    n = times.size
    gpus = rng.choice(gpu_values, size=n, p=gpu_probs)
    work = _work_samples(ctx, rng, n) * scale
    offline = rng.random(n) < offline_share
    state = rng.uniform(s_min, s_max, size=n)
    work = np.clip(work, min_work * HOUR_S, max_work * HOUR_S)
    work = np.where(offline, np.minimum(work, max_off * HOUR_S), work)
    gpus = np.where(offline, 1, gpus)

    kinds = [JobKind.OFFLINE if off else JobKind.TRAINING for off in offline]
    return Workload(
        jobs=_gpu_jobs(name, team, priority, kinds, gpus, times, work, ckpt, state, cpu, mem)
    )


def backlog(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """`count` jobs queued at once (or spread uniformly over spread_h): a stress burst, with
    log-uniform work in [work_h_min, work_h_max]."""
    p = Params(params, "backlog")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    count = p.int_("count", lo=0)
    submit_s, spread_s = p.num("submit_h", lo=0) * HOUR_S, p.num("spread_h", lo=0) * HOUR_S
    gpu_values, gpu_probs = p.choices("gpu_choices", "gpu_weights")
    if gpu_values.min() < 1:
        raise SpecError("generator 'backlog': gpu_choices must all be >= 1")
    w_min, w_max = p.pos("work_h_min"), p.pos("work_h_max")
    if w_min > w_max:
        raise SpecError("generator 'backlog': need work_h_min <= work_h_max")
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    kind = JobKind(p.text("kind", [JobKind.TRAINING.value, JobKind.OFFLINE.value]))
    cpu, mem = _job_resources(p)

    times = np.sort(submit_s + rng.uniform(0.0, spread_s, size=count))
    gpus = rng.choice(gpu_values, size=count, p=gpu_probs)
    work = np.exp(rng.uniform(math.log(w_min), math.log(w_max), size=count)) * HOUR_S
    states = np.full(count, state)
    jobs = _gpu_jobs(
        name, team, priority, [kind] * count, gpus, times, work, ckpt, states, cpu, mem
    )
    if p.given("elastic_min_frac"):  # elastic: runs on this share of its GPUs or more
        frac = p.num("elastic_min_frac", lo=0.0, hi=1.0)
        jobs = tuple(
            replace(j, gpu_count_min=max(1, math.ceil(j.gpu_count * frac)))
            if j.gpu_count > 1
            else j
            for j in jobs
        )
    return Workload(jobs=_placed(p, rng, jobs))


def _placed(p: Params, rng: np.random.Generator, jobs: Sequence[JobSpec]) -> tuple[JobSpec, ...]:
    """Deadlines, datasets and allowed GPU types (the _PLACEMENT parameters). Draws come
    after the jobs' own, so entries without them keep their jobs unchanged."""
    slack = p.nums("deadline_slack", lo=1.0)
    if slack and len(slack) != 2:
        raise SpecError(f"generator {p.generator!r}: deadline_slack is [min, max], got {slack}")
    min_deadline_s = p.num("min_deadline_h", lo=0) * HOUR_S
    datasets = p.texts("datasets")
    models = frozenset(p.texts("gpu_models"))
    n = len(jobs)
    factors = rng.uniform(min(slack), max(slack), size=n) if slack else None
    where = None
    sizes = None
    if datasets:
        weights = p.nums("dataset_weights", lo=0) or [1.0] * len(datasets)
        if len(weights) != len(datasets) or sum(weights) <= 0:
            raise SpecError(
                f"generator {p.generator!r}: dataset_weights needs one weight per dataset"
            )
        probs = np.array(weights) / sum(weights)
        where = rng.choice(len(datasets), size=n, p=probs)
        lo, hi = p.num("dataset_gb_min", lo=0), p.num("dataset_gb_max", lo=0)
        if lo > hi:
            raise SpecError(f"generator {p.generator!r}: need dataset_gb_min <= dataset_gb_max")
        sizes = (
            np.exp(rng.uniform(math.log(lo), math.log(hi), size=n)) if lo > 0 else np.full(n, hi)
        )
    out = []
    for i, job in enumerate(jobs):
        changes: dict[str, object] = {}
        if factors is not None and job.duration_s is not None:
            span = max(job.duration_s * float(factors[i]), min_deadline_s)
            changes["deadline_s"] = job.submit_s + span
        if where is not None and sizes is not None:
            changes["dataset"] = datasets[int(where[i])]
            changes["dataset_gb"] = float(sizes[i])
        if models:
            changes["gpu_models"] = models
        for key in ("topology", "topology_preferred"):
            if p.given(key):
                changes[key] = p.text(key)
        out.append(replace(job, **changes) if changes else job)  # type: ignore[arg-type]
    return tuple(out)


def _gpu_jobs(
    name: str,
    team: str,
    priority: int,
    kinds: Sequence[JobKind],
    gpus: npt.NDArray[np.int64],
    times: npt.NDArray[np.float64],
    work: npt.NDArray[np.float64],
    ckpt: float,
    states: npt.NDArray[np.float64],
    cpu_per_gpu: int,
    mem_per_gpu: int,
) -> tuple[JobSpec, ...]:
    """Whole-GPU jobs, CPU and memory in proportion to their GPUs."""
    return tuple(
        JobSpec(
            job_id=f"{name}-{i}",
            gpu_count=int(gpus[i]),
            cpu_milli=cpu_per_gpu * int(gpus[i]),
            mem_mib=mem_per_gpu * int(gpus[i]),
            team=team,
            priority=priority,
            kind=kinds[i],
            submit_s=float(times[i]),
            duration_s=float(work[i]),
            checkpoint_interval_s=ckpt,
            state_gib_per_gpu=float(states[i]),
        )
        for i in range(len(kinds))
    )


def itp(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """Real jobs of one Microsoft ITP 2021 cluster (raw trace: submit, duration, GPUs).

    Keeps the jobs submitted in [start_day, start_day + days) days, shifted so the window
    starts at 0. The trace has no teams, kinds or priorities, so they are drawn (seeded): the
    team uniformly from `teams` (or `team` for all); an online_share of the 1-GPU jobs become
    online inference (a service deployment that runs for its duration, never preempted) at
    online_priority; the rest are training with a priority drawn from
    priorities/priority_weights (or `priority` for all).
    """
    p = Params(params, "itp")
    name = p.name()
    cluster = p.text("cluster")
    rel = ITP_RAW_DIR / f"{cluster}.csv"
    if ctx.traces_dir is not None and not (ctx.traces_dir / rel).is_file():
        folder = ctx.traces_dir / ITP_RAW_DIR
        found = sorted(f.stem for f in folder.glob("cluster*.csv")) if folder.is_dir() else []
        if found:
            raise SpecError(
                f"generator 'itp': no ITP cluster {cluster!r} in {folder}; "
                f"use one of: {', '.join(found)}"
            )
    path = trace_file(ctx, "itp", rel)
    if p.given("team") and p.given("teams"):
        raise SpecError("generator 'itp': give `team` (one team for all) or `teams`, not both")
    teams = [p.text("team")] if p.given("team") else p.texts("teams")
    if not teams:
        raise SpecError("generator 'itp': teams must not be empty")
    if p.given("priority") and (p.given("priorities") or p.given("priority_weights")):
        raise SpecError(
            "generator 'itp': give `priority` (one for all) or `priorities`/`priority_weights`, "
            "not both"
        )
    if p.given("priority"):
        prio_values, prio_probs = np.array([p.int_("priority")]), np.array([1.0])
    else:
        prio_values, prio_probs = p.choices("priorities", "priority_weights")
    start_s = p.num("start_day", lo=0) * DAY_S
    days = p.pos("days")
    end_s = start_s + days * DAY_S
    online_share = p.num("online_share", lo=0, hi=1)
    online_priority = p.int_("online_priority")
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)

    kept = [j for j in itp_jobs(path) if start_s <= j.submit_s < end_s]
    n = len(kept)
    team_idx = rng.integers(0, len(teams), size=n)
    online_draw = rng.random(n)
    prios = rng.choice(prio_values, size=n, p=prio_probs)
    jobs: list[JobSpec] = []
    for i, job in enumerate(kept):
        online = job.gpu_count == 1 and online_draw[i] < online_share
        jobs.append(
            JobSpec(
                job_id=f"{name}-{job.job_id}",
                gpu_count=job.gpu_count,
                cpu_milli=cpu * job.gpu_count,
                mem_mib=mem * job.gpu_count,
                team=teams[int(team_idx[i])],
                priority=online_priority if online else int(prios[i]),
                kind=JobKind.ONLINE if online else JobKind.TRAINING,
                submit_s=job.submit_s - start_s,
                duration_s=job.duration_s,
                checkpoint_interval_s=ckpt,
                state_gib_per_gpu=state,
            )
        )
    return Workload(jobs=tuple(jobs))


def single_job(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """One job given in full: a named case a scenario must get right (e.g. a short job
    whose data sits far away)."""
    p = Params(params, "job")
    gpus = p.int_("gpus", lo=1)
    cpu, mem = _job_resources(p)
    submit_s = p.num("submit_h", lo=0) * HOUR_S
    deadline = p.num("deadline_h", lo=0) * HOUR_S if p.given("deadline_h") else None
    job = JobSpec(
        job_id=p.name(),
        gpu_count=gpus,
        cpu_milli=cpu * gpus,
        mem_mib=mem * gpus,
        team=p.text("team"),
        priority=p.int_("priority"),
        kind=JobKind(p.text("kind", [k.value for k in JobKind if k is not JobKind.ONLINE])),
        submit_s=submit_s,
        duration_s=p.pos("work_min") * 60.0,
        checkpoint_interval_s=p.pos("checkpoint_interval_s"),
        state_gib_per_gpu=p.num("state_gib_per_gpu", lo=0),
        deadline_s=None if deadline is None else submit_s + deadline,
        dataset=p.text("dataset") if p.given("dataset") else None,
        dataset_gb=p.num("dataset_gb", lo=0),
        gpu_models=frozenset(p.texts("gpu_models")),
        gpu_count_min=p.int_("gpus_min", lo=1) if p.given("gpus_min") else None,
    )
    return Workload(jobs=(job,))


def model_jobs(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """Jobs given by a model instead of a GPU count: `count` of them, submitted uniformly
    over [submit_h, submit_h + spread_h), each with log-uniform work in [tokens_min,
    tokens_max] tokens (to generate, or to train on). The scheduler sizes each one per GPU
    type with the planner (gpupool.sizing) when it is submitted."""
    from gpupool.sizing.planner import PlanRequest
    from gpupool.sizing.shapes import get_shape

    p = Params(params, "model-jobs")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    count = p.int_("count", lo=0)
    task = p.text("task", ["inference", "training"])
    submit_s, spread_s = p.num("submit_h", lo=0) * HOUR_S, p.num("spread_h", lo=0) * HOUR_S
    t_min, t_max = p.pos("tokens_min"), p.pos("tokens_max")
    if t_min > t_max:
        raise SpecError("generator 'model-jobs': need tokens_min <= tokens_max")
    deadline = p.nums("deadline_h", lo=0)
    if deadline and len(deadline) != 2:
        raise SpecError(f"generator 'model-jobs': deadline_h is [min, max], got {deadline}")
    shape = get_shape(p.text("model"))
    times = np.sort(submit_s + rng.uniform(0.0, spread_s, size=count))
    tokens = np.exp(rng.uniform(math.log(t_min), math.log(t_max), size=count))
    spans = rng.uniform(min(deadline), max(deadline), size=count) * HOUR_S if deadline else None
    kind = JobKind.TRAINING if task == "training" else JobKind.OFFLINE
    jobs = []
    sized = {}
    for i in range(count):
        job_id = f"{name}-{i}"
        jobs.append(
            JobSpec(
                job_id=job_id,
                team=team,
                priority=priority,
                kind=kind,
                submit_s=float(times[i]),
                checkpoint_interval_s=p.pos("checkpoint_interval_s"),
                state_gib_per_gpu=p.num("state_gib_per_gpu", lo=0),
                deadline_s=None if spans is None else float(times[i] + spans[i]),
            )
        )
        sized[job_id] = PlanRequest(
            shape=shape,
            task=task,
            precision=p.text("precision"),
            context=p.int_("context", lo=1),
            seq_len=p.int_("seq_len", lo=1),
            batch=p.int_("batch", lo=1),
            grad_accum=p.int_("grad_accum", lo=1),
            tokens=float(tokens[i]),
        )
    return Workload(jobs=tuple(jobs), sized=sized)
