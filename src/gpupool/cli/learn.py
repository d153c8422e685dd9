"""`gpupool learn status|promote|demote`: the learners of a running server, the learned
job order and the services' demand forecast (`gpupool learn forecast`, offline, is in
forecast.py).

`status` shows what the server's learner has seen (jobs, days), how accurate its
predictions were (share within 2x, rank correlation), the guard's state, the model's
version and when it was trained, the mode (shadow or active) and how often the shadow
agreed with the rules; then it replays the last N days of this cluster's own finished jobs
(GET /v1/learn/history) through the simulator under the rule policy and under the learned
one, on a fleet of the server's size, and prints both. `promote` runs the same replay and
asks the server to make the learned policy active only when it wins; the server checks the
evidence again (409 when it does not carry a win). `demote` returns it to shadow.
`promote forecast|colocation` and `demote forecast|colocation` do the same for the demand
forecast and the learned co-location admission, which the server judges on its own record
(the forecast's errors against the simple opponents; the measured speeds of the pairs the
co-location model admits).

The replay runs here, in the CLI: the server never imports the simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpupool.cli.forecast import add_forecast_parser
from gpupool.cli.output import emit
from gpupool.cli.table import render
from gpupool.cli.verbs import HELP
from gpupool.errors import SpecError

if TYPE_CHECKING:
    from gpupool.client import Client
    from gpupool.learning.config import LearningConfig

DEFAULT_DAYS = 14.0


def add_learn_parser(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """`gpupool learn status|promote|demote` (promote and demote need an admin token)."""
    p = sub.add_parser("learn", help=HELP["learn"])
    lsub = p.add_subparsers(
        dest="learn_command", metavar="{status,promote,demote,forecast}", required=True
    )
    days = argparse.ArgumentParser(add_help=False)
    days.add_argument(
        "--days",
        type=float,
        default=DEFAULT_DAYS,
        help=f"replay this many days of the cluster's history (default {DEFAULT_DAYS:g})",
    )
    s = lsub.add_parser(
        "status",
        parents=[conn, as_json, days],
        help="data seen, accuracy, drift state, mode, and a replay of the last days",
    )
    s.set_defaults(client_handler=cmd_learn_status)
    learner = argparse.ArgumentParser(add_help=False)
    learner.add_argument(
        "learner",
        nargs="?",
        default="order",
        choices=("order", "forecast", "colocation"),
        help="order (default): the learned job order, judged by a replay of the last days; "
        "forecast: the services' demand forecast; colocation: the learned co-location "
        "admission (both judged by their own guard on the server)",
    )
    pr = lsub.add_parser(
        "promote",
        parents=[conn, as_json, days, learner],
        help="make a learner active: the job order if a replay of the last days shows a "
        "win, the forecast if its guard trusts it for at least one service, co-location if "
        "its guard's window of measured pairs is within its bound",
    )
    pr.set_defaults(client_handler=cmd_learn_promote)
    d = lsub.add_parser(
        "demote", parents=[conn, as_json, learner], help="return a learner to shadow"
    )
    d.add_argument("--reason", default="", help="why (kept with the change)")
    d.set_defaults(client_handler=cmd_learn_demote)
    add_forecast_parser(lsub)


# ---- the replay ----------------------------------------------------------------------------
def learning_config_of(body: Mapping[str, Any]) -> LearningConfig:
    """The server's learning section from its JSON (GET /v1/learn's `config`)."""
    # imported here: NumPy and the learner load only for the learn commands, not for every
    # `gpupool ls` (this module's parser is built with the other client commands)
    from gpupool.learning.config import LearningConfig
    from gpupool.learning.guard import GuardConfig
    from gpupool.learning.ordering import LasQueues

    fields = dict(body)
    guard = GuardConfig(**dict(fields.pop("guard", {})))
    las_body = dict(fields.pop("las", {}))
    las = LasQueues(tuple(las_body.get("thresholds_gpu_s", LasQueues().thresholds_gpu_s)))
    return LearningConfig(**fields, guard=guard, las=las)


def fleet_shape(fleet: Mapping[str, Any]) -> tuple[int, int]:
    """(nodes, GPUs per node) of the replay: the server's own when its nodes are alike,
    else one node of all its GPUs (placement across unlike nodes is not modelled)."""
    per_node = [int(n) for n in fleet.get("gpus_per_node", [])]
    if not per_node:
        raise SpecError("the server reports no GPUs: there is no fleet to replay on")
    if len(set(per_node)) == 1:
        return len(per_node), per_node[0]
    return 1, sum(per_node)


def replay_history(history: Mapping[str, Any], learning: LearningConfig) -> dict[str, Any]:
    """Replay the history's finished jobs under the rule and the learned policy (each job
    runs its measured GPU-time on its GPU count) on a fleet of the server's shape.

    Without preemption, as the live core runs both: its ordered policies only choose which
    waiting job starts next. (A preemptive replay judged another policy: it suspended a
    job a moment from its end once the job outran its predicted q90.)"""
    from gpupool.domain.model import JobSpec
    from gpupool.sim.replay.run import run_replay

    rows = history["jobs"]
    # the replay's second 0 is the first submit; the predictor is told its wall-clock time
    # (origin_s), so hour and weekday features stay true
    origin_s = min((float(j["submit_s"]) for j in rows), default=0.0)
    jobs = [
        JobSpec(
            job_id=str(j["id"]),
            gpu_count=int(j["gpu_count"]),
            team=str(j["team"]),
            submit_s=float(j["submit_s"]) - origin_s,
            duration_s=max(float(j["run_gpu_s"]) / int(j["gpu_count"]), 1e-3),
            name=str(j["name"]),
        )
        for j in rows
    ]
    nodes, per_node = fleet_shape(history["fleet"])
    out: dict[str, Any] = {
        "days": float(history["days"]),
        "jobs": len(jobs),
        "nodes": nodes,
        "gpus_per_node": per_node,
        "rule": learning.rule,
        "predictor": learning.predictor,
    }
    if not jobs:
        return out
    active = dataclasses.replace(learning, mode="active")
    results = {}
    for label, queue in ((learning.rule, learning.rule), ("learned", "learned")):
        r = run_replay(
            jobs,
            nodes,
            per_node,
            queue=queue,
            name=f"learn-{label}",
            learning=active,
            origin_s=origin_s,
            preemptive=False,
        )
        results[label] = r.metrics
    rule_m, learned_m = results[learning.rule], results["learned"]
    out["jobs"] = min(rule_m.finished, learned_m.finished)
    out["rule_mean_jct_s"] = rule_m.avg_jct_s
    out["learned_mean_jct_s"] = learned_m.avg_jct_s
    out["replay"] = {
        label: {
            "finished": m.finished,
            "mean_jct_s": m.avg_jct_s,
            "p50_jct_s": m.p50_jct_s,
            "p99_jct_s": m.p99_jct_s,
            "mean_queue_s": m.avg_queue_s,
            "utilization": m.utilization,
        }
        for label, m in results.items()
    }
    return out


def verdict(ev: Mapping[str, Any], min_jobs: int) -> tuple[bool, str]:
    """Whether the replay is a win the server will accept, and the sentence saying so."""
    days, jobs, rule = ev["days"], ev["jobs"], ev["rule"]
    if "rule_mean_jct_s" not in ev:
        return False, f"no job finished here in the last {days:g} days: nothing to replay"
    r, lrn = ev["rule_mean_jct_s"], ev["learned_mean_jct_s"]
    figures = f"mean JCT {lrn:.1f} s learned against {r:.1f} s {rule} over {jobs} jobs"
    if jobs < min_jobs:
        return False, (
            f"the replay of the last {days:g} days covers {jobs} finished jobs, fewer than the "
            f"{min_jobs} the guard needs ({figures}); let more jobs finish or replay more days"
        )
    if not lrn < r:
        return False, (
            f"the learned policy does not win the replay of the last {days:g} days: {figures}"
        )
    gain = 1.0 - lrn / r if r > 0 else 0.0
    return (
        True,
        f"the learned policy wins the replay of the last {days:g} days: "
        f"{figures} ({gain:.1%} less)",
    )


# ---- the commands --------------------------------------------------------------------------
def _replay_for(client: Client, view: Mapping[str, Any], days: float) -> dict[str, Any]:
    if not days > 0 or not math.isfinite(days):
        raise SpecError(f"--days {days:g}: give a number of days above 0")
    history = client.learn_history(days)
    return replay_history(history, learning_config_of(view["config"]))


def cmd_learn_status(client: Client, args: argparse.Namespace) -> int:
    view = client.learn()
    forecasts = forecast_text(view) + colocation_text(view)
    if view.get("order") is False:  # the server learns its services' demand only
        return emit(args, view, lambda: forecasts)
    ev = _replay_for(client, view, args.days)
    ok, sentence = verdict(ev, int(view["min_jobs"]))
    return emit(
        args,
        {**view, "replay": ev, "replay_wins": ok},
        lambda: status_text(view, ev, sentence, time.time()) + ("\n\n" + forecasts),
    )


def scales_on(state: str, mode: str) -> str:
    if state != "trusted":
        return "reactive rule"
    return "forecast" if mode == "active" else "reactive rule (shadow)"


def forecast_text(view: Mapping[str, Any]) -> str:
    """Each service's demand forecaster: history, its error against the best simple
    opponent over the guard's window, p90 coverage and who scales the service."""
    demand = view.get("demand", "declared")
    if demand != "forecast":
        return f"demand forecasts: off (autoscale.demand: {demand})"
    cfg: Mapping[str, Any] = view.get("forecast_config") or {}
    forecasts: Mapping[str, Mapping[str, Any]] = view.get("forecasts") or {}
    mode = str(view.get("forecast_mode", "active"))
    head = (
        f"demand forecasts: mode {mode} ({view.get('forecast_mode_reason', '')}); trusted "
        f"after {cfg.get('cold_start_days', 14):g} days of a service's history, judged over "
        f"the last {cfg.get('judge_days', 7):g} days"
    )
    change = view.get("forecast_last_change")
    if change:
        head += (
            f"\nlast change: {change['action']} by {change['by'] or 'the server'} "
            f"{_stamp(change['at_s'], time.time())}: {change['reason']}"
        )
    if not forecasts:
        return head + "\n(no service has reported a rate yet)"
    rows = []
    for name, s in sorted(forecasts.items()):
        opp: Mapping[str, float] = s.get("opponents_rel_mae") or {}
        best = min(opp, key=lambda k: opp[k]) if opp else None
        rows.append(
            [
                name,
                f"{float(s['history_days']):.1f} d",
                s["state"],
                scales_on(str(s["state"]), mode),
                str(s["model_version"]),
                _num(s.get("learned_rel_mae"), ".3f"),
                "-" if best is None else f"{opp[best]:.3f} ({best})",
                _pct(s.get("p90_coverage")),
                _num(s.get("forecast_rps"), ".1f"),
            ]
        )
    table = render(
        [
            "service",
            "history",
            "guard",
            "scales on",
            "model",
            "rel. error",
            "best opponent",
            "p90 cover",
            "p90 rps",
        ],
        rows,
    )
    return head + "\n" + table


def colocation_text(view: Mapping[str, Any]) -> str:
    """The co-location admission (`sharing.admission`): who decides and why, the guard's
    record of the model on measured pairs, and whether a promotion would be refused."""
    st: Mapping[str, Any] | None = view.get("colocation")
    if st is None:
        return "\n\nco-location admission: off (sharing.admission.decider: off)"
    mode = f", mode {st['mode']}" if st.get("mode") else ""
    lines = [
        f"co-location admission: decider {st['decider']}{mode}; the {st['decides']} decides "
        f"({st['why']})",
        *(
            [f"  mode set:  {view.get('colocation_mode_reason')}"]
            if view.get("colocation_mode_reason")
            else []
        ),
        f"  profiles:  {st['profiles']} job names; the model admits a pair at "
        f"{_num(st['min_speed'])}x or faster, the rule at summed SM <= "
        f"{_num(st['max_sum_sm_pct'], '.0f')}%",
    ]
    if st["decider"] == "learned":
        lines.append(
            f"  guard:     {'trusted' if st['trusted'] else 'fallen back'}; "
            f"{st['pairs_judged']} pairs judged, {_pct(st['slowed_share'])} of the last "
            f"{st['window_pairs']} slowed (bound {_pct(st['max_slowed_share'])}, judged "
            f"after {st['min_pairs']}); {st['guard_changes']} changes"
            + (f", last: {st['last_change']}" if st.get("last_change") else "")
        )
        if not st.get("measured_speeds", True):
            lines.append(f"  measured:  {st['measured_note']}")
        problem = st.get("promotion_problem")
        lines.append(
            "  promotion: " + (f"refused: {problem}" if problem else "the record carries it")
        )
    return "\n\n" + "\n".join(lines)


def cmd_learn_promote(client: Client, args: argparse.Namespace) -> int:
    if args.learner != "order":  # judged on the server's own record: it refuses with why
        after = client.learner_promote(args.learner)
        return emit(args, after, lambda: f"the {args.learner} learner is now active")
    view = client.learn()
    ev = _replay_for(client, view, args.days)
    ok, sentence = verdict(ev, int(view["min_jobs"]))
    if not ok:
        print(f"gpupool: promotion refused: {sentence}")
        return 1
    after = client.learn_promote(ev)
    return emit(args, after, lambda: f"{sentence}; the learned policy is now {after['mode']}")


def cmd_learn_demote(client: Client, args: argparse.Namespace) -> int:
    if args.learner != "order":
        after = client.learner_demote(args.learner, args.reason)
        return emit(
            args,
            after,
            lambda: f"the {args.learner} learner is now in shadow: judged, never acted on",
        )
    after = client.learn_demote(args.reason)
    return emit(args, after, lambda: f"the learned policy is now {after['mode']}: the rules decide")


# ---- the status text -----------------------------------------------------------------------
def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.0f}%"


def _num(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(float(x), fmt)


def _days(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) / 86_400:.2f} days"


def status_text(
    view: Mapping[str, Any], ev: Mapping[str, Any], sentence: str, now_wall: float
) -> str:
    st: Mapping[str, Any] = view.get("status") or {}
    cfg: Mapping[str, Any] = view.get("config") or {}
    guard_cfg: Mapping[str, Any] = cfg.get("guard") or {}
    shadow: Mapping[str, Any] = view.get("shadow") or {}
    model = st.get("model")
    lines = [
        f"learned policy: mode {view['mode']} ({view.get('mode_reason', '')}); rule "
        f"{cfg.get('rule')}, predictor {cfg.get('predictor')}",
        f"data seen:  {st.get('submits_seen', 0)} submitted, {st.get('finished_seen', 0)} "
        f"finished over {_days(st.get('seen_s'))} (the model is trusted after "
        f"{_days(guard_cfg.get('cold_start_s'))} and {guard_cfg.get('min_finished')} finished)",
        f"accuracy:   {_pct(st.get('within_2x'))} within 2x, rank correlation "
        f"{_num(st.get('rank_corr'))} (last {st.get('window', 0)} finished jobs)",
        f"guard:      {st.get('guard')}"
        + (" (the model's order is in use)" if st.get("uses_model") else " (the rules decide)"),
        "model:      none trained yet"
        if not model
        else f"model:      {model.get('kind')} version {model.get('version')}, trained "
        f"{_stamp(model.get('trained_at_s'), now_wall)} on {model.get('rows')} jobs "
        f"({st.get('retrains', 0)} retrains since start)",
        f"shadow:     {st.get('shadow_cycles', 0)} cycles compared since start, agreement "
        f"{_pct(st.get('agreement'))} ({shadow.get('differed', 0)} differed, "
        f"{shadow.get('events_written', 0)} learn-shadow events written)",
    ]
    change = view.get("last_change")
    if change:
        lines.append(
            f"last change: {change['action']} by {change['by'] or 'the server'} "
            f"{_stamp(change['at_s'], now_wall)}: {change['reason']}"
        )
    lines.append("")
    lines.append(
        f"replay of the last {ev['days']:g} days: {ev['jobs']} jobs on "
        f"{ev['nodes']} node(s) x {ev['gpus_per_node']} GPU(s)"
    )
    replay = ev.get("replay")
    if replay:
        rows = [
            [
                label,
                m["finished"],
                f"{m['mean_jct_s']:.1f}",
                f"{m['p50_jct_s']:.1f}",
                f"{m['p99_jct_s']:.1f}",
                f"{m['mean_queue_s']:.1f}",
                f"{100 * m['utilization']:.0f}%",
            ]
            for label, m in replay.items()
        ]
        lines.append(
            render(["policy", "jobs", "mean JCT s", "p50 s", "p99 s", "mean queue s", "util"], rows)
        )
    lines.append(sentence)
    return "\n".join(lines)


def _stamp(at_s: Any, now_s: float) -> str:
    """A server time (wall-clock seconds) as a UTC date and how long ago."""
    if at_s is None:
        return "-"
    at = float(at_s)
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when} ({_ago(at, now_s)})"


def _ago(at_s: float, now_s: float) -> str:
    dt = now_s - at_s
    if dt < 0:
        return "in the future of this machine's clock"
    if dt < 120:
        return f"{dt:.0f} s ago"
    if dt < 7_200:
        return f"{dt / 60:.0f} min ago"
    if dt < 2 * 86_400:
        return f"{dt / 3_600:.1f} h ago"
    return f"{dt / 86_400:.1f} days ago"
