"""The learned queue against its rule opponents on every Microsoft ITP 2021 cluster (and
the Philly-Pollux list as one pool, --traces pollux).

For each cluster (8-GPU nodes) the node count where the FIFO replay runs at 70-80 %
utilisation is searched, then at that load and at +-25 % (nodes / 0.75 and nodes / 1.25)
every queue is replayed: fifo, backfill, 2D-LAS, 2D-Gittins, oracle SJF and SRTF, the
learned queue (guarded), and the learned queue with deliberately wrong predictors
(shuffled, inverted), guarded and unguarded. The predictor learns only from jobs finished
before each moment (the replay feeds it submits and finishes in time order) and retrains
on its schedule. Writes bench/results/learned-order.md and .json (learned_gavel.* with
--traces gavel: the Philly-derived Gavel traces, model type as the job name;
learned-order-pollux.* with --traces pollux); the checks are computed at the end and
printed with their figures.

    .venv/bin/python bench/bench_learned.py            # the full run
    .venv/bin/python bench/bench_learned.py --quick --clusters cluster10,cluster01
    .venv/bin/python bench/bench_learned.py --workers 1 --loads base \
        --variants las,gittins,"srtf (oracle)",learned     # a part, base load first

The acceptance lines (bench/learned_acceptance.py) are computed on whatever rows exist.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightgbm
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gpupool.errors import SpecError
from gpupool.learning.config import MODEL_ORDERS, RULES, LearningConfig
from gpupool.learning.history import History, JobFacts
from gpupool.learning.predictor import Prediction, Predictor, WrappedPredictor
from gpupool.sim.replay.ordered import default_predictor
from gpupool.sim.replay.run import run_replay
from gpupool.traces.loaders import load_replay_trace
from gpupool.traces.philly import read_pollux_philly
from learned_acceptance import acceptance, median_in_window_rho
from machine import describe

GPUS_PER_NODE = 8
BAND = (0.70, 0.80)
TARGET_UTIL = 0.75
ITP_ORIGIN_S = 1_614_816_000.0
"""2021-03-04 00:00 UTC, the trace's second 0 (its README), for hour and weekday."""
WEEK_S = 7 * 86_400.0

VARIANTS: tuple[tuple[str, str, str | None, bool], ...] = (
    # (label, queue, predictor, guarded)
    ("fifo", "fifo", None, True),
    ("backfill", "backfill", None, True),
    ("las", "las", None, True),
    ("gittins", "gittins", None, True),
    ("sjf (oracle)", "sjf", None, True),
    ("srtf (oracle)", "srtf", None, True),
    ("learned", "learned", "default", True),
    ("learned unguarded", "learned", "default", False),
    ("shuffled guarded", "learned", "shuffled", True),
    ("shuffled unguarded", "learned", "shuffled", False),
    ("inverted guarded", "learned", "inverted", True),
    ("inverted unguarded", "learned", "inverted", False),
)
LOADS = (("base", 1.0), ("+25% load", 1.25), ("-25% load", 0.75))


def shared_itp() -> Path:
    for base in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        p = base / "traces" / "microsoft-itp-2021" / "raw-traces"
        if p.is_dir():
            return p
    raise SystemExit("shared/traces/microsoft-itp-2021 not found beside the repository")


def shared_gavel() -> Path:
    for base in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        p = base / "traces" / "philly" / "gavel-msr-traces-seed0"
        if p.is_dir():
            return p
    raise SystemExit("shared/traces/philly/gavel-msr-traces-seed0 not found")


def shared_pollux() -> Path:
    for base in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        p = base / "traces" / "philly-pollux" / "philly.csv"
        if p.is_file():
            return p
    raise SystemExit("shared/traces/philly-pollux/philly.csv not found")


TRACES = {
    "itp": "Microsoft ITP 2021",
    "gavel": "Philly-derived Gavel traces (seed 0)",
    "pollux": "Philly (Pollux's job list), one shared pool, the VC as team",
}
POLLUX_ORIGIN: dict[str, float] = {}
SOURCE = {"name": "itp"}
"""Which trace set this run replays (set before the worker processes fork)."""
DEFAULT_MIX: dict[str, Any] = {
    "weight": LearningConfig().weight,
    "max_spread": LearningConfig().max_spread,
    "model_order": LearningConfig().model_order,
    "rule": LearningConfig().rule,
}
MIX = dict(DEFAULT_MIX)
GUARD = LearningConfig().guard
"""The guard every guarded replay runs under (the default; the records say its bars)."""
ORDER_WORDS = {
    "gittins": "the Gittins index of the GPU-times of finished jobs whose predicted median "
    "fell in the job's bin (learning.model_order gittins)",
    "remaining": "predicted GPU-time still to go (learning.model_order remaining)",
}
RULE_WORDS = {
    "las": "2D-LAS (learning.rule las)",
    "gittins": "2D-Gittins on the recent finished jobs (learning.rule gittins)",
}
"""The learned order's mix (learning.weight, learning.max_spread, learning.model_order,
learning.rule), set by the options."""
_JOBS: dict[str, Any] = {}


def cluster_names() -> list[str]:
    if SOURCE["name"] == "pollux":
        return ["philly-pollux"]
    if SOURCE["name"] == "gavel":
        return sorted(p.name.split(".")[0] for p in shared_gavel().glob("*.trace.txt"))
    return sorted(p.stem for p in shared_itp().glob("cluster*.csv"))


def cluster_jobs(name: str) -> Any:
    if name not in _JOBS and SOURCE["name"] == "pollux":
        jobs, report = read_pollux_philly(shared_pollux())
        POLLUX_ORIGIN["s"] = report.origin_s
        _JOBS[name] = jobs
    if name not in _JOBS:
        if SOURCE["name"] == "gavel":
            path, fmt = shared_gavel() / f"{name}.trace.txt", "gavel"
        else:
            path, fmt = shared_itp() / f"{name}.csv", "itp"
        ((_, jobs, _),) = load_replay_trace(path, fmt)
        _JOBS[name] = jobs
    return _JOBS[name]


def origin_s() -> float:
    """The trace's second 0 as a UTC epoch second, for hour and weekday features; the Gavel
    traces do not say when they start (0: the features keep the cycle, not the date)."""
    if SOURCE["name"] == "pollux":
        cluster_jobs("philly-pollux")
        return POLLUX_ORIGIN["s"]
    return ITP_ORIGIN_S if SOURCE["name"] == "itp" else 0.0


class Recording(WrappedPredictor):
    """A predictor that keeps each job's latest prediction (the one its order used), for
    the in-window rank correlation."""

    def __init__(self, inner: Predictor) -> None:
        super().__init__(inner)
        self.q50: dict[str, float] = {}

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        p = self.inner.predict(facts, history)
        if p is not None:
            self.q50[facts.job_id] = p.q50_gpu_s
        return p


def predictor_named(name: str, config: LearningConfig) -> Predictor:
    if name == "default":
        return default_predictor(config, origin_s())
    from gpupool.learning.factory import make_predictor

    return make_predictor(replace(config, predictor=name), origin_s())


def predictor_kind(name: str | None) -> str:
    if name is None:
        return ""
    try:
        return type(predictor_named(name, LearningConfig())).__name__
    except ImportError:
        return "unavailable"


def fifo_util(cluster: str, nodes: int) -> float:
    return run_replay(cluster_jobs(cluster), nodes, GPUS_PER_NODE, "fifo").metrics.utilization


def find_nodes(cluster: str) -> dict[str, Any]:
    """Node count where FIFO runs in the band: start from mean demand at 75 %, then
    rescale by the measured utilisation (it falls as nodes are added), a few tries."""
    jobs = cluster_jobs(cluster)
    gpu_s = sum(j.gpu_count * (j.duration_s or 0.0) for j in jobs)
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    biggest = max(j.gpu_count for j in jobs)
    least = max(1, math.ceil(biggest / GPUS_PER_NODE))
    nodes = max(least, round(gpu_s / span / (TARGET_UTIL * GPUS_PER_NODE)))
    tried: dict[int, float] = {}
    for _ in range(8):
        if nodes in tried:
            break
        util = fifo_util(cluster, nodes)
        tried[nodes] = util
        if BAND[0] <= util <= BAND[1]:
            break
        nodes = max(least, round(nodes * util / TARGET_UTIL))
        if nodes in tried:  # rounding cycles: step by one node towards the band
            nodes = nodes + 1 if util > BAND[1] else nodes - 1
            nodes = max(least, nodes)
    in_band = {n: u for n, u in tried.items() if BAND[0] <= u <= BAND[1]}
    if in_band:
        best = min(in_band, key=lambda n: abs(in_band[n] - TARGET_UTIL))
    else:
        best = min(tried, key=lambda n: abs(tried[n] - TARGET_UTIL))
    return {
        "cluster": cluster,
        "nodes": best,
        "fifo_util": tried[best],
        "in_band": bool(in_band),
        "tried": {str(n): round(u, 4) for n, u in sorted(tried.items())},
    }


def run_one(task: tuple[str, str, int, str]) -> dict[str, Any]:
    cluster, load, nodes, label = task
    _, queue, pred, guarded = next(v for v in VARIANTS if v[0] == label)
    jobs = cluster_jobs(cluster)
    config = LearningConfig(guarded=guarded, **MIX)
    predictor = Recording(predictor_named(pred, config)) if pred is not None else None
    r = run_replay(
        jobs,
        nodes,
        GPUS_PER_NODE,
        queue,
        "consolidate",
        0,
        cluster,
        learning=config,
        predictor=predictor,
        origin_s=origin_s(),
    )
    m = r.metrics
    submit = {j.job_id: j.submit_s for j in jobs}
    t0 = min(submit.values())
    weeks: dict[int, list[float]] = {}
    judged: list[tuple[float, float]] = []
    gpu_s = {j.job_id: j.gpu_count * (j.duration_s or 0.0) for j in jobs}
    for d in r.log.decisions:
        if d.action == "finish":
            s = submit[d.job_id]
            weeks.setdefault(int((s - t0) // WEEK_S), []).append(d.time_s - s)
            if predictor is not None and d.job_id in predictor.q50:
                judged.append((predictor.q50[d.job_id], gpu_s[d.job_id]))
    first_trusted = next((c.t_s for c in r.guard_changes if c.after.value == "trusted"), None)
    return {
        "cluster": cluster,
        "load": load,
        "nodes": nodes,
        "policy": label,
        "queue": queue,
        "predictor": pred,
        "guarded": guarded,
        "jobs": m.jobs,
        "finished": m.finished,
        "mean_jct_h": m.avg_jct_s / 3600,
        "p50_jct_h": m.p50_jct_s / 3600,
        "p99_jct_h": m.p99_jct_s / 3600,
        "mean_queue_h": m.avg_queue_s / 3600,
        "utilization": m.utilization,
        "preemptions": m.preemptions,
        "guard_changes": len(r.guard_changes),
        "first_trusted_day": None if first_trusted is None else (first_trusted - t0) / 86400,
        "trusted_days": r.trusted_s / 86400,
        "retrains": len(r.retrains),
        "rho_in_window": median_in_window_rho(judged),
        "weekly_mean_jct_h": {
            str(w): [float(np.mean(v)) / 3600, len(v)] for w, v in sorted(weeks.items())
        },
        "wall_s": r.wall_s,
    }


def checks(
    rows: list[dict[str, Any]], clusters: list[str], rule: str = "gittins"
) -> list[dict[str, Any]]:
    """The acceptance lines on the rows of the checked clusters (learned_acceptance.py)."""
    return acceptance([r for r in rows if r["cluster"] in clusters], rule)


def verdict(ok: bool | None) -> str:
    return "NOT RUN" if ok is None else "PASS" if ok else "FAIL"


def mix_of(data: dict[str, Any]) -> dict[str, Any]:
    """The mix a record ran: records older than an option ran what was then the default."""
    old = {"weight": 0.75, "max_spread": 16.0, "model_order": "remaining", "rule": "las"}
    return {**old, **data.get("mix", {})}


def render(data: dict[str, Any]) -> str:
    mix = mix_of(data)
    lines = [f"# The learned queue against the rule baselines: {TRACES[data['traces']]}", ""]
    lines += [
        "Trace replay (`gpupool.sim.replay.run`), 8-GPU nodes, consolidate placement, free "
        "preemption for the preemptive queues (las, gittins, srtf, learned; preemptions "
        "counted). Each cluster at the node count where FIFO runs at 70-80 % utilisation "
        "(busy GPU-time / (GPUs x makespan)), and at +25 % load (nodes / 1.25) and -25 % "
        "load (nodes / 0.75). JCT and queueing delay in hours.",
        "",
        f"Command: `{data['command']}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items()),
        "",
        f"Predictors: learned uses `{data['predictors']['default']}`; the wrong ones are "
        f"`{data['predictors']['shuffled']}` (shuffled) and `{data['predictors']['inverted']}` "
        "(inverted). Strict time split: the predictor sees a job's GPU-time only once it "
        "finished in the replay, and retrains on its schedule (weekly for the LightGBM "
        "model). Guard: rules only for the first two weeks (cold start), then the model "
        "orders jobs only while its order would have served recent pairs of jobs that "
        "waited together better than the rule's own (learning.guard.judge order: trusted "
        f"from +{(GUARD.min_advantage + GUARD.advantage_margin) * 100:g} %, falls back below "
        f"+{GUARD.min_advantage * 100:g} %).",
        "",
        f"Mix: {mix['weight']:g} of the picks follow the predicted order; a job whose "
        f"predicted q90/q10 is above {mix['max_spread']:g} follows the rule order; the "
        f"predicted order ranks by {ORDER_WORDS[mix['model_order']]}; the rule order it "
        f"mixes with and falls back to is {RULE_WORDS[mix['rule']]}.",
        "",
        f"Run time {data['total_s'] / 60:.1f} min on {data['workers']} processes"
        + (" (--quick: a short run, not the full benchmark)" if data["quick"] else "")
        + ".",
        "",
        f"Replays finished: {data['replays_done']} of {data['replays_planned']}"
        + (
            ""
            if data["replays_done"] == data["replays_planned"]
            else " (the run was cut short: the tables hold what finished)"
        )
        + ".",
        "",
        *[f"{n}\n" for n in data.get("notes", [])],
        "## Acceptance",
        "",
        "Checked on the clusters whose FIFO replay reaches the 70-80 % band: "
        + ", ".join(data["checked_clusters"])
        + ". The others are listed in the load search and their rows shown, not checked. "
        "R is the rule the learned order falls back to (learning.rule), B the better of "
        "2D-LAS and 2D-Gittins per cell in hindsight; a line is NOT RUN when no cell has the "
        "rows it needs. Cells run (cluster, load: queues):",
        "",
        *[
            f"- {c} {load}: "
            + ", ".join(
                sorted(
                    p
                    for (cc, ll), ps in cells_run(data).items()
                    if cc == c and ll == load
                    for p in ps
                )
            )
            for c, load in sorted(cells_run(data))
        ],
        "",
        "| check | result | figures |",
        "|---|---|---|",
    ]
    for c in data["checks"]:
        lines.append(f"| {c['check']} | {verdict(c['pass'])} | {c['figures']} |")
    for c in data["checks"]:
        if c["detail"]:
            lines += ["", f"{c['check']}:", ""] + [f"- {d}" for d in c["detail"]]
    lines += ["", "## Load search (FIFO utilisation by node count)", ""]
    lines += [
        "| cluster | jobs | nodes | FIFO util | in band | tried |",
        "|---|---|---|---|---|---|",
    ]
    for s in data["search"]:
        lines.append(
            f"| {s['cluster']} | {s['jobs']} | {s['nodes']} | {s['fifo_util']:.1%} | "
            f"{'yes' if s['in_band'] else 'NO'} | "
            + ", ".join(f"{n}: {u:.1%}" for n, u in s["tried"].items())
            + " |"
        )
    lines += ["", "## Results", ""]
    for s in data["search"]:
        c = s["cluster"]
        lines += [
            f"### {c}",
            "",
            "| load | nodes | queue | mean JCT | p50 JCT | p99 JCT | mean queue | util | "
            "preempt | guard changes | first trusted (day) | trusted days | median rho in-window |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for load, _ in LOADS:
            for label, *_ in VARIANTS:
                r = next(
                    (
                        x
                        for x in data["rows"]
                        if x["cluster"] == c and x["load"] == load and x["policy"] == label
                    ),
                    None,
                )
                if r is None:
                    continue
                learned = r["queue"] == "learned"
                ft = r["first_trusted_day"]
                lines.append(
                    f"| {load} | {r['nodes']} | {label} | {r['mean_jct_h']:.2f} | "
                    f"{r['p50_jct_h']:.2f} | {r['p99_jct_h']:.2f} | {r['mean_queue_h']:.2f} | "
                    f"{r['utilization']:.1%} | {r['preemptions']} | "
                    + (
                        f"{r['guard_changes']} | {'never' if ft is None else f'{ft:.1f}'} | "
                        f"{r['trusted_days']:.1f} | {rho_text(r)} |"
                        if learned
                        else "| | | |"
                    )
                )
        lines.append("")
    return "\n".join(lines) + "\n"


def rho_text(row: dict[str, Any]) -> str:
    rho = row.get("rho_in_window")
    return "-" if rho is None else f"{rho:.2f}"


def cells_run(data: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for r in data["rows"]:
        out.setdefault((r["cluster"], r["load"]), []).append(r["policy"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", help="comma-separated cluster names (default: all)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="base load only and no unguarded variants: a short run to check the pipeline",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--variants",
        help="comma-separated queue labels to run (default: all): "
        + ", ".join(v[0] for v in VARIANTS),
    )
    ap.add_argument(
        "--loads",
        help="comma-separated loads to run (default: all): "
        + ", ".join(x for x, _ in LOADS).replace("%", "%%"),
    )
    ap.add_argument(
        "--traces",
        choices=tuple(TRACES),
        default="itp",
        help="itp: the ten ITP 2021 clusters (learned-order.md); gavel: the Philly-derived Gavel "
        "traces, one VC per file, the model type as the job's name (learned_gavel.md); "
        "pollux: Pollux's Philly job list as one pool, the VC as team (learned_pollux.md)",
    )
    ap.add_argument(
        "--weight",
        type=float,
        default=MIX["weight"],
        help="share of the picks that follow the predicted order (learning.weight; default "
        "%(default)s)",
    )
    ap.add_argument(
        "--max-spread",
        type=float,
        default=MIX["max_spread"],
        help="a job whose predicted q90/q10 is above this follows the rule order "
        "(learning.max_spread; default %(default)s)",
    )
    ap.add_argument(
        "--model-order",
        choices=MODEL_ORDERS,
        default=MIX["model_order"],
        help="how the predicted order ranks a job (learning.model_order; default %(default)s)",
    )
    ap.add_argument(
        "--rule",
        choices=RULES,
        default=MIX["rule"],
        help="the rule order the learned one mixes with and falls back to (learning.rule; "
        "default %(default)s)",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument(
        "--render",
        action="store_true",
        help="only write the .md again from the .json of an earlier run (checks recomputed)",
    )
    ap.add_argument("--note", action="append", default=[], help="with --render: a paragraph to add")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the replays of an earlier run cut short (same traces and mix; its node "
        "counts) and run only the ones it lacks",
    )
    args = ap.parse_args()
    stem = record_stem(args.traces)
    if args.render:
        data = json.loads((args.out / f"{stem}.json").read_text(encoding="utf-8"))
        data["checks"] = checks(data["rows"], data["checked_clusters"], mix_of(data)["rule"])
        data.setdefault("traces", args.traces)
        data["notes"] = [*data.get("notes", []), *args.note]
        (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n", "utf-8")
        (args.out / f"{stem}.md").write_text(render(data), encoding="utf-8")
        return 0
    started = time.perf_counter()
    SOURCE["name"] = args.traces
    MIX.update(
        weight=args.weight,
        max_spread=args.max_spread,
        model_order=args.model_order,
        rule=args.rule,
    )
    try:
        LearningConfig(**MIX)  # a bad value is refused here, before any replay
    except SpecError as err:
        ap.error(str(err))
    names = cluster_names()
    if args.clusters:
        names = [c for c in args.clusters.split(",") if c]
    loads = LOADS[:1] if args.quick else LOADS
    if args.loads:
        wanted_loads = args.loads.split(",")
        loads = tuple(x for x in LOADS if x[0] in wanted_loads)
    variants = [v for v in VARIANTS if not (args.quick and not v[3])]
    if args.variants:
        wanted = args.variants.split(",")
        unknown = set(wanted) - {v[0] for v in VARIANTS}
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}")
        variants = [v for v in variants if v[0] in wanted]
    earlier = earlier_run(args, names) if args.resume else None
    ctx = mp.get_context("fork")
    with ctx.Pool(args.workers) as pool:
        if earlier is not None:
            search = earlier["search"]  # the node counts its replays ran at
            recorded = earlier["all_search"]  # and every cluster the record holds
        else:
            search = []
            for s in pool.imap(find_nodes, names):
                s["jobs"] = len(cluster_jobs(s["cluster"]))
                print(
                    f"[search] {s['cluster']}: {s['nodes']} nodes, FIFO {s['fifo_util']:.1%}"
                    + ("" if s["in_band"] else " (NOT in the 70-80 % band)"),
                    flush=True,
                )
                search.append(s)
            recorded = search
        tasks = []
        for s in search:
            for load, factor in loads:
                nodes = max(1, round(s["nodes"] / factor))
                for label, *_ in variants:
                    tasks.append((s["cluster"], load, nodes, label))
        # base load first, small clusters first: a run cut short still holds whole
        # (cluster, load) sets, and the most of them
        size = {s["cluster"]: s["jobs"] for s in search}
        load_rank = {load: k for k, (load, _) in enumerate(LOADS)}
        tasks.sort(key=lambda t: (load_rank[t[1]], size[t[0]]))
        rows: list[dict[str, Any]] = []
        if earlier is not None:
            # every earlier row is kept (another --clusters, --variants or --loads adds to
            # the record); only the replays it lacks run
            rows = list(earlier["rows"])
            kept = {task_of(r) for r in rows}
            tasks = [t for t in tasks if t not in kept]
            started -= earlier["total_s"]
            print(f"[resume] {len(rows)} replays kept, {len(tasks)} to run", flush=True)
        data: dict[str, Any] = {}
        done = len(rows)
        for k, row in enumerate(pool.imap_unordered(run_one, tasks), done + 1):
            rows.append(row)
            print(
                f"[{k}/{done + len(tasks)}] {row['cluster']} {row['load']} {row['policy']}: "
                f"mean JCT {row['mean_jct_h']:.2f} h, util {row['utilization']:.1%}, "
                f"{row['wall_s']:.1f}s ({(time.perf_counter() - started) / 60:.1f} min)",
                flush=True,
            )
            data = write(args, recorded, rows, done + len(tasks), started)
        if not tasks:
            data = write(args, recorded, rows, done, started)
    for c in data["checks"]:
        print(f"{verdict(c['pass'])}  {c['check']}: {c['figures']}")
    print(f"wrote {args.out} ({args.traces}) in {data['total_s'] / 60:.1f} min")
    return 0


def record_stem(traces: str) -> str:
    """The results file's name without its suffix (.json, .md) for a trace set."""
    # learned.json is the record of the order before issue 34 (rule 2D-LAS, no shrinkage,
    # the accuracy guard), which docs/learned-results.md quotes: kept as it was
    return {"itp": "learned-order", "gavel": "learned_gavel", "pollux": "learned-order-pollux"}[
        traces
    ]


def task_of(row: dict[str, Any]) -> tuple[str, str, int, str]:
    return (row["cluster"], row["load"], row["nodes"], row["policy"])


def earlier_run(args: argparse.Namespace, names: list[str]) -> dict[str, Any] | None:
    """The .json of an earlier run to go on from, or None (with the reason) when it cannot:
    another trace set or mix would mix two experiments in one table."""
    path = args.out / f"{record_stem(args.traces)}.json"
    if not path.is_file():
        print(f"[resume] no {path}: starting afresh", flush=True)
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("traces", "itp") != args.traces or mix_of(data) != MIX:
        raise SystemExit(
            f"{path} holds another experiment (traces {data.get('traces')}, mix "
            f"{mix_of(data)}, this run {args.traces}, {MIX}): run without --resume, or "
            "with the options of that run"
        )
    if data.get("quick") and not args.quick:
        print("[resume] the earlier run was --quick: its base-load replays are kept", flush=True)
    searched = {s["cluster"] for s in data["search"]}
    if not set(names) <= searched:
        raise SystemExit(
            f"{path} did not size clusters {sorted(set(names) - searched)}: run without "
            "--resume, or name only the clusters it has"
        )
    data["all_search"] = data["search"]
    data["search"] = [s for s in data["search"] if s["cluster"] in names]
    return data


def write(
    args: argparse.Namespace,
    search: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    planned: int,
    started: float,
) -> dict[str, Any]:
    """Results so far, written after every replay (a run cut short keeps what finished)."""
    in_band = [s["cluster"] for s in search if s["in_band"]]
    data: dict[str, Any] = {
        "benchmark": f"learned queue vs rule baselines, {TRACES[args.traces]}, trace replay",
        "traces": args.traces,
        "command": " ".join(["python bench/bench_learned.py", *sys.argv[1:]]),
        "machine": {**describe(), "lightgbm": lightgbm.__version__},
        "workers": args.workers,
        "quick": args.quick,
        "replays_done": len(rows),
        "replays_planned": planned,
        "predictors": {p: predictor_kind(p) for p in ("default", "shuffled", "inverted")},
        "mix": dict(MIX),
        "search": search,
        "checked_clusters": in_band,
        "rows": sorted(rows, key=lambda r: (r["cluster"], r["load"], r["policy"])),
        "checks": checks(rows, in_band, MIX["rule"]),
        "total_s": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = record_stem(args.traces)
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(render(data), encoding="utf-8")
    return data


if __name__ == "__main__":
    sys.exit(main())
