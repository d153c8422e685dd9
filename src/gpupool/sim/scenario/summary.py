"""What a scenario run reports: its summary (per team, kind and GPU count; cost, energy,
deadlines, clouds, heat, borrowing) and its per-job rows, read off a world that has run.

Kept apart from the world's stepping (world.py): nothing here changes the world.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from gpupool.domain.lifecycle import TERMINAL, JobState
from gpupool.domain.model import MILLI_PER_GPU, JobKind
from gpupool.domain.topology import spanned_level
from gpupool.sim.scenario.runs import Run
from gpupool.sim.scenario.world import ScenarioSim


def scenario_summary(sim: ScenarioSim, wall_s: float) -> dict[str, Any]:
    """The run's summary: totals, per team and kind, resources, what each job width got,
    borrowing; `wall_s` is how long the run took."""
    cfg = sim.cfg
    runs = sim.runs  # one join of core and world records for the whole report
    jobs = [r for r in runs.values() if r.service is None]
    total_gpu_s = sum(sim.pool_gpus.values()) * cfg.horizon_s
    used = sum(r.gpu_s for r in runs.values())

    def stats(rs: list[Run]) -> dict[str, Any]:
        fin = [r for r in rs if r.state is JobState.FINISHED]
        jct = np.array([r.end_s - r.spec.submit_s for r in fin if r.end_s is not None])
        queue = np.array(
            [(r.end_s - r.spec.submit_s) - r.held_s for r in fin if r.end_s is not None]
        )
        return {
            "jobs": len(rs),
            "finished": len(fin),
            "gpu_hours": round(sum(r.gpu_s for r in rs) / 3600, 1),
            "avg_jct_h": round(float(jct.mean()) / 3600, 3) if jct.size else None,
            "p99_jct_h": round(float(np.percentile(jct, 99)) / 3600, 3) if jct.size else None,
            "avg_queue_h": round(float(queue.mean()) / 3600, 3) if queue.size else None,
            "preemptions": sum(r.preemptions for r in rs),
            "lost_work_gpu_h": round(sum(r.lost_work_s * r.spec.gpu_count for r in rs) / 3600, 2),
        }

    requests = sum(s.requests for s in sim.service_stats.values())
    ok = sum(s.ok for s in sim.service_stats.values())
    online_jobs = [r for r in jobs if r.spec.kind is JobKind.ONLINE]
    job_slo = online_job_slo(sim, online_jobs)
    parts = [x for x in ((ok / requests) if requests else None, job_slo) if x is not None]
    teams: dict[str, Any] = {}
    for team in sorted(sim.known_teams):
        mine = [r for r in jobs if r.spec.team == team]
        svc = [s for s in sim.services.values() if s.team == team]
        t_req = sum(sim.service_stats[s.name].requests for s in svc)
        t_ok = sum(sim.service_stats[s.name].ok for s in svc)
        replicas_gpu_s = sum(
            r.gpu_s for r in runs.values() if r.service is not None and r.spec.team == team
        )
        entry = stats(mine)
        entry["gpu_hours"] = round((sum(r.gpu_s for r in mine) + replicas_gpu_s) / 3600, 1)
        entry["utilization"] = round(entry["gpu_hours"] * 3600 / total_gpu_s, 4)
        entry["online_slo_attainment"] = round(t_ok / t_req, 5) if t_req else None
        entry["guarantee_violation_s"] = round(sim.violation_s.get(team, 0.0), 1)
        entry["by_kind"] = {
            kind.value: stats([r for r in mine if r.spec.kind is kind])
            for kind in JobKind
            if any(r.spec.kind is kind for r in mine)
        }
        teams[team] = entry
    ended = {s: sum(1 for r in jobs if r.state is s) for s in JobState}
    for team in teams:
        teams[team].update(sim.meter.teams[team].rounded())
    return resource_summary(sim, jobs) | {
        "scenario": cfg.name,
        "mode": cfg.scheduling.mode,
        "policy": cfg.scheduling.policy,
        "jobs_submitted": len(jobs),
        "jobs_finished": ended[JobState.FINISHED],
        "jobs_cancelled": ended[JobState.CANCELLED],
        "jobs_failed": ended[JobState.FAILED] + ended[JobState.UNPLACEABLE],
        "jobs_lost": sum(1 for r in jobs if r.state not in TERMINAL or not r.end_reason),
        "gpu_hours_utilization": round(used / total_gpu_s, 4),
        "online_slo_attainment": round(min(parts), 5) if parts else None,
        "guarantee_violation_s": round(sum(sim.violation_s.values()), 1),
        "preemptions": sum(r.preemptions for r in jobs),
        "training_gpu_hours": round(
            sum(r.gpu_s for r in jobs if r.spec.kind is JobKind.TRAINING) / 3600, 1
        ),
        "lost_work_gpu_hours": round(sum(r.lost_work_s * r.spec.gpu_count for r in jobs) / 3600, 2),
        "replicas_started": sum(
            1 for r in runs.values() if r.service is not None and r.first_start_s is not None
        ),
        "scale_events": len(sim.scale_events),
        "kinds": {
            kind.value: stats([r for r in jobs if r.spec.kind is kind])
            for kind in JobKind
            if any(r.spec.kind is kind for r in jobs)
        },
        "teams": teams,
        "end_reasons": dict(sorted(_count(r.end_reason for r in jobs).items())),
        "waited_with": {code: len(ids) for code, ids in sorted(sim.waited_with.items())},
        **served_summary(jobs, cfg.horizon_s),
        **borrowing(sim, jobs),
        **gang_domains(sim),
        "wall_s": round(wall_s, 2),
    }


def borrowing(sim: ScenarioSim, jobs: list[Run]) -> dict[str, Any]:
    """Elastic jobs: their resizes and the offline GPU-hours lost to borrowing (what
    they lent to online work, plus the GPU time their checkpoints and restarts for a
    resize held idle), per team. Empty where no job is elastic."""
    declared = sim.core.book.elastic.declared
    elastic = [r for r in jobs if r.spec.job_id in declared or r.spec.gpu_count_min]
    if not elastic:
        return {}
    by_team: dict[str, float] = defaultdict(float)
    for r in elastic:
        by_team[r.spec.team] += (r.lent_gpu_s + r.resize_gpu_s) / 3600
    lent = sum(r.lent_gpu_s for r in elastic) / 3600
    restart = sum(r.resize_gpu_s for r in elastic) / 3600
    return {
        "borrowing": {
            "elastic_jobs": len(elastic),
            "resizes": sim.core.book.elastic.resizes,
            "resize_enabled": sim.core.book.elastic.enabled,
            "lent_gpu_hours": round(lent, 2),
            "restart_gpu_hours": round(restart, 2),
            "offline_gpu_hours_lost_to_borrowing": round(lent + restart, 2),
            "by_team": {t: round(h, 2) for t, h in sorted(by_team.items())},
        }
    }


def gang_domains(sim: ScenarioSim) -> dict[str, Any]:
    """Where the gangs ran, with topology levels: per start, the narrowest level one
    domain of which held it (`across` when none), for all gangs and for those that
    require a level; and the mean speed the spanning cost them (domain/topology.py)."""
    state = sim.engine.state
    levels = state.topology.levels
    if not levels:
        return {}
    names = (*levels, "across")
    starts = {"all": dict.fromkeys(names, 0), "required": dict.fromkeys(names, 0)}
    speeds: list[float] = []
    for d in sim.engine.log.decisions:
        if d.action != "start" or d.placement is None or len(d.placement.shares) < 2:
            continue
        level = spanned_level(state.level_ids, d.placement.nodes)
        starts["all"][names[level]] += 1
        if sim.job(d.job_id).spec.topology is not None:
            starts["required"][names[level]] += 1
        speeds.append(state.topology.speed(d.placement.gpu_count, level))
    return {
        "topology": {
            "placement": "aware" if state.topology.aware else "blind",
            "gang_starts": starts,
            "mean_gang_speed": round(float(np.mean(speeds)), 4) if speeds else None,
        }
    }


def site_of(sim: ScenarioSim, pool: str) -> str:
    return sim.cfg.pool(pool).site or sim.cfg.name


def run_cost_usd(sim: ScenarioSim, run: Run) -> float:
    """What the GPU time costs where it ran; cloud time is billed per node instead."""
    if not run.gpu_type or (
        sim.cloud_nodes and run.gpu_type in {sim.node_pool[n] for n in sim.cloud_nodes}
    ):
        return 0.0
    return run.gpu_s * sim.pool_price.get(run.gpu_type, 0.0) / 3600.0


def missed_deadline(sim: ScenarioSim, run: Run) -> bool:
    deadline = run.spec.deadline_s
    if deadline is None:
        return False
    if run.state is JobState.FINISHED and run.end_s is not None:
        return run.end_s > deadline + 1e-6
    return deadline < sim.cfg.horizon_s


def resource_summary(sim: ScenarioSim, jobs: list[Run]) -> dict[str, Any]:
    """Cost, energy, deadlines, clouds and heat: the keys of the right-sizing issue."""
    total = sim.meter.total()
    finished = [r for r in jobs if r.state is JobState.FINISHED and r.end_s is not None]
    jct = [r.end_s - r.spec.submit_s for r in finished if r.end_s is not None]
    cloud_usd = sim.cloud_billed_usd
    events = sim.cloud_events
    currencies = sorted({t.currency for t in sim.tariff_of.values() if t is not None})
    clusters: dict[str, Any] = {}
    runs = sim.runs
    for site in sorted(set(sim.node_site)):
        entry: dict[str, Any] = sim.meter.sites[site].rounded()
        entry["idle_energy_kwh"] = round(sim.meter.idle[site].energy_kwh, 2)
        held = [r for r in runs.values() if r.gpu_type and site_of(sim, r.gpu_type) == site]
        entry["gpu_hours"] = round(sum(r.gpu_s for r in held) / 3600, 1)
        clusters[site] = entry
    by_type: dict[str, float] = defaultdict(float)
    for r in runs.values():
        if r.gpu_type:
            by_type[sim.cfg.pool(r.gpu_type).gpu_type] += r.gpu_s / 3600
    out: dict[str, Any] = {
        "cost_usd": round(sum(run_cost_usd(sim, r) for r in runs.values()) + cloud_usd, 2),
        "cloud_cost_usd": round(cloud_usd, 2),
        "energy_kwh": round(total.energy_kwh, 2),
        "electricity_cost": round(total.electricity_cost, 2),
        "electricity_currency": currencies[0] if len(currencies) == 1 else ",".join(currencies),
        "carbon_kg": round(total.carbon_kg, 2)
        if any(t is not None and t.carbon_g_per_kwh for t in sim.tariff_of.values())
        else None,
        "deadline_misses": sum(1 for r in jobs if missed_deadline(sim, r)),
        "jobs_with_deadline": sum(1 for r in jobs if r.spec.deadline_s is not None),
        "avg_jct_s": round(float(np.mean(jct)), 1) if jct else None,
        "bursts": sum(1 for e in events if e.action == "burst"),
        "reclaims": sum(1 for e in events if e.action == "reclaim"),
        "burst_log": [
            {
                "t_h": round(e.t_s / 3600, 3),
                "action": e.action,
                "nodes": e.nodes,
                "reason": e.reason,
            }
            for e in events
        ],
        "rejected_remote_placements": len(sim.core.pool_choice.rejected_remote),
        "transfer_hours": round(sum(r.transfer_s for r in jobs) / 3600, 2),
        "gpu_hours_by_type": {k: round(v, 1) for k, v in sorted(by_type.items())},
        "power_cap_commands": sim.cap_commands,
        "clock_locks": sim.clock_changes[0],
        "clock_unlocks": sim.clock_changes[1],
        "clusters": clusters,
    }
    if sim.heat is not None:
        out["thermal"] = {
            "max_temp_c": round(sim.heat.max_c, 1),
            "gpu_hours_above_threshold": round(sim.heat.above_s / 3600, 2),
            "gpu_hours_hot_while_cooler_idle": round(sim.heat.hot_while_cool_idle_s / 3600, 2),
        }
    return out


def job_rows(sim: ScenarioSim) -> list[dict[str, Any]]:
    """Per job: where it ran, when, and its energy, electricity cost and carbon."""
    rows = []
    runs = sim.runs
    for job_id in sorted(runs):
        r = runs[job_id]
        if r.service is not None:
            continue
        ledger = sim.meter.jobs.get(job_id)
        rows.append(
            {
                "job_id": job_id,
                "team": r.spec.team,
                "kind": r.spec.kind.value,
                "pool": r.gpu_type,
                "gpus": r.spec.gpu_count,
                "state": r.state.value,
                "submit_s": r.spec.submit_s,
                "start_s": r.first_start_s,
                "end_s": r.end_s,
                "deadline_s": r.spec.deadline_s,
                "transfer_s": round(r.transfer_s, 1),
                "gpu_hours": round(r.gpu_s / 3600, 3),
                "cost_usd": round(run_cost_usd(sim, r), 3),
                "energy_kwh": round(ledger.energy_kwh, 3) if ledger else 0.0,
                "electricity_cost": round(ledger.electricity_cost, 3) if ledger else 0.0,
                "carbon_kg": round(ledger.carbon_kg, 3) if ledger else 0.0,
            }
        )
    return rows


def online_job_slo(sim: ScenarioSim, online: list[Run]) -> float | None:
    """Online jobs (tagged services in a job trace): share of their life spent deployed
    on GPUs, allowing one scheduling cycle plus its victims' checkpoint time to start."""
    wanted = served = 0.0
    for r in online:
        end = r.end_s if r.end_s is not None else sim.cfg.horizon_s
        life = end - r.spec.submit_s
        if life <= 0:
            continue
        wanted += life
        allowed = sim.cfg.scheduling.cycle_s + sim.core.book.claim_grace.get(r.spec.job_id, 0.0)
        served += min(life, r.held_s + allowed)
    return served / wanted if wanted else None


def served_summary(jobs: list[Run], horizon_s: float) -> dict[str, Any]:
    """Which jobs the GPU-hours went to. A total of GPU-hours, or of jobs finished, hides
    it: a policy can finish many small jobs while wide ones never start, or spend hours on
    jobs still unfinished (suspended, checkpointed) when the horizon ends. Per GPU count
    (fractional shares as "share"): jobs, started, finished, GPU-hours, mean JCT of the
    finished, and how long the oldest job that never started had waited at the end."""
    finished = [r for r in jobs if r.state is JobState.FINISHED and r.end_s is not None]
    unfinished = [r for r in jobs if r.state is not JobState.FINISHED and r.gpu_s > 0]
    widths: dict[str, list[Run]] = defaultdict(list)
    for r in jobs:
        share = r.spec.gpu_milli < MILLI_PER_GPU
        widths["share" if share else str(r.spec.gpu_count)].append(r)

    def order(key: str) -> tuple[int, int]:
        return (0, 0) if key == "share" else (1, int(key))

    by_gpus: dict[str, Any] = {}
    for key in sorted(widths, key=order):
        rs = widths[key]
        done = [r for r in rs if r.state is JobState.FINISHED and r.end_s is not None]
        never = [r.spec.submit_s for r in rs if r.first_start_s is None]
        jct = [r.end_s - r.spec.submit_s for r in done if r.end_s is not None]
        by_gpus[key] = {
            "jobs": len(rs),
            "started": sum(1 for r in rs if r.first_start_s is not None),
            "finished": len(done),
            "gpu_hours": round(sum(r.gpu_s for r in rs) / 3600, 1),
            "avg_jct_h": round(float(np.mean(jct)) / 3600, 3) if jct else None,
            "oldest_never_started_wait_h": round((horizon_s - min(never)) / 3600, 1)
            if never
            else None,
        }
    spent = sum(r.gpu_s for r in jobs)
    by_width, max_wait_s = waits_by_width(jobs, horizon_s)
    return {
        "finished_gpu_hours": round(sum(r.gpu_s for r in finished) / 3600, 1),
        "unfinished_gpu_hours": round(sum(r.gpu_s for r in unfinished) / 3600, 1),
        "unfinished_started_jobs": sum(1 for r in unfinished if r.first_start_s is not None),
        "gpu_hours_per_finished_job": round(spent / 3600 / len(finished), 2) if finished else None,
        "by_gpus": by_gpus,
        "by_width": by_width,
        "max_wait_s": max_wait_s,
    }


def waits_by_width(jobs: list[Run], horizon_s: float) -> tuple[dict[str, Any], float | None]:
    """How long jobs of each width (GPUs per job, as a string) waited for their first
    start: a job that never started waited until the horizon, so a width that starves
    shows it. With the longest wait of all jobs (None: no jobs)."""
    widths: dict[int, list[float]] = defaultdict(list)
    never: dict[int, int] = defaultdict(int)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # jobs, started, finished
    for r in jobs:
        n = r.spec.gpu_count
        first = r.first_start_s
        started = first is not None
        widths[n].append((horizon_s if first is None else first) - r.spec.submit_s)
        never[n] += not started
        c = counts[n]
        c[0] += 1
        c[1] += started
        c[2] += r.state is JobState.FINISHED
    out = {
        str(n): {
            "jobs": counts[n][0],
            "started": counts[n][1],
            "finished": counts[n][2],
            "mean_wait_s": round(float(np.mean(widths[n])), 1),
            "max_wait_s": round(max(widths[n]), 1),
            "never_started": never[n],
        }
        for n in sorted(widths)
    }
    waits = [w for ws in widths.values() for w in ws]
    return out, round(max(waits), 1) if waits else None


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for x in items:
        out[x] += 1
    return dict(out)
