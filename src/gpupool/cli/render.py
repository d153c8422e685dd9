"""Turn what the server sent into text for the terminal: tables, one-fact-a-line blocks
and the sentences of `why` and `top`.

Nothing here talks to the server or reads the command line: a command fetches, then hands
the JSON to one of these. Every piece of text the server sent (names, commands, reasons)
goes through printable(), so a job named with terminal escapes cannot paint over anyone's
screen.
"""

from __future__ import annotations

import shlex
import time
import unicodedata
from datetime import datetime
from typing import Any

from gpupool.cli import table

_DRAIN_STATES = ("draining", "drained")


def why_text(j: dict[str, Any]) -> str:
    """`gpupool why`: the job's state, its reason code and the sentence."""
    job_id, state = j.get("id", "?"), str(j.get("state", "?"))
    code = str(j.get("reason_code") or "")
    reason = str(j.get("reason") or "")
    sentence = reason[len(code) + 2 :] if code and reason.startswith(f"{code}: ") else reason
    if code:
        head = printable(f"job {job_id} {state}: {code}")
        return f"{head}\n  {printable(sentence)}" if sentence else head
    if state in ("pending", "suspended"):
        return printable(f"job {job_id} {state}: {sentence or 'no reason given yet'}")
    return printable(f"job {job_id} is {state}; nothing holds it back ({sentence or '-'})")


def signals_line(sig: dict[str, Any], now: float) -> str:
    reclaimable = sig.get("reclaimable") or []
    parts = [
        f"scale-out: {'YES' if sig.get('scale_out') else 'no'}",
        f"mean util {_num(sig.get('mean_util_pct'), '{:.1f}%')} over "
        f"{_num(sig.get('window_s'), '{:g}')} s",
        "reclaimable GPUs: " + (", ".join(str(r) for r in reclaimable) or "none"),
    ]
    at = sig.get("evaluated_at")
    parts.append("not evaluated yet" if at is None else f"evaluated {_span(now - at)} ago")
    return "signals: " + "; ".join(parts)


def gpu_table(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for node in nodes:
        for g in node.get("gpus") or []:
            healthy = g.get("healthy", True) and node.get("healthy", True)
            rows.append(
                [
                    node.get("name", "?"),
                    g.get("index", "?"),
                    g.get("model") or node.get("gpu_model") or "-",
                    _num(g.get("util_pct"), "{:.0f}"),
                    _memory(g.get("mem_used_mib"), g.get("mem_total_mib")),
                    _num(g.get("temp_c"), "{:.0f}"),
                    f"{_num(g.get('power_w'), '{:.0f}')}/{_num(g.get('power_limit_w'), '{:.0f}')}",
                    "-" if g.get("job_id") is None else g["job_id"],
                    "yes" if g.get("reclaimable") else "",
                    ("ok" if healthy else (g.get("problem") or "unhealthy"))
                    + (f" ({node['state']})" if node.get("state") in _DRAIN_STATES else ""),
                ]
            )
            rows[-1] = _safe(rows[-1])
    if not rows:
        return "no GPUs reported"
    headers = ["node", "gpu", "model", "util %", "mem GiB", "temp C", "power W", "job"]
    return table.render([*headers, "reclaim", "health"], rows)


def job_table(jobs: list[dict[str, Any]], now: float, placement: bool = False) -> str:
    """The ls table; top adds where each job runs."""
    headers = ["id", "name", "team", "kind", "prio", "GPUs", "state", "age/runtime", "reason"]
    if placement:
        headers.insert(6, "on")
    rows = []
    for j in jobs:
        state = j.get("state", "?") + (" (preempting)" if j.get("preempting") else "")
        state += " (held)" if j.get("held") else ""
        row: list[object] = [
            j.get("id", "?"),
            printable(str(j.get("name") or "-")),
            j.get("team") or "-",
            j.get("kind") or "-",
            j.get("priority", "-"),
            _gpus(j),
            state,
            _age(j, now),
            _cut(printable(str(j.get("reason_code") or j.get("reason") or "")), 48),
        ]
        if placement:
            row.insert(6, _cut(printable(_placement(j) or "-"), 32))
        rows.append(_safe(row))
    return table.render(headers, rows)


def job_block(j: dict[str, Any], now: float) -> str:
    """`gpupool show` without --json: one fact a line."""
    state = j.get("state", "?") + (", preempting" if j.get("preempting") else "")
    cp = j.get("checkpoint_every_s")
    facts = [
        ("team", j.get("team") or "-"),
        ("kind", j.get("kind") or "-"),
        ("priority", j.get("priority", "-")),
        ("GPUs", _gpus(j) + (f" on {_placement(j)}" if j.get("gpus") else "")),
        ("command", shlex.join(str(a) for a in j.get("command") or [])),
        ("attempts", f"{j.get('attempts', 0)} (preempted {j.get('preemptions', 0)} times)"),
        ("submitted", _when(j.get("submitted_at"), now)),
        ("started", _when(j.get("started_at"), now)),
        ("ended", _when(j.get("ended_at"), now)),
        ("exit code", "-" if j.get("exit_code") is None else j["exit_code"]),
        ("checkpoint", "never" if cp is None else f"every {_span(cp)}"),
        *_sizing_facts(j),
        *type_facts(j),
        *_lifecycle_facts(j),
        ("grace", _span(j["grace_s"]) if j.get("grace_s") is not None else "-"),
        ("reason", j.get("reason") or "-"),
    ]
    facts += _placement_facts(j, now)
    lines = [
        f"job {j.get('id', '?')}  {printable(str(j.get('name') or '-'))}  ({printable(state)})"
    ]
    lines += [f"  {k:<12}{printable(str(v))}" for k, v in facts]
    return "\n".join(lines)


def _placement_facts(j: dict[str, Any], now: float) -> list[tuple[str, object]]:
    """What multi-cluster placement knows of the job; only the fields that are set."""
    facts: list[tuple[str, object]] = []
    if j.get("dataset") or j.get("dataset_gb"):
        facts.append(("dataset", f"{j.get('dataset') or '-'} ({j.get('dataset_gb') or 0:g} GB)"))
    if j.get("deadline_at") is not None:
        at = j["deadline_at"]
        stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
        left = f"in {_span(at - now)}" if at > now else f"{_span(now - at)} ago"
        facts.append(("deadline", f"{stamp} ({left})"))
    if j.get("user_region") is not None:
        facts.append(("users in", j["user_region"]))
    if j.get("latency_bound_ms") is not None:
        facts.append(("latency", f"within {j['latency_bound_ms']:g} ms"))
    return facts


def _lifecycle_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The time limit and the hold; only those that are set."""
    facts: list[tuple[str, object]] = []
    if j.get("time_limit_s") is not None:
        facts.append(("time limit", f"{_span(j['time_limit_s'])} per run"))
    if j.get("held"):
        facts.append(("held", f"yes: `gpupool release {j.get('id')}` lets it start"))
    return facts


def _sizing_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The checkpoint size and the model the job is sized by; only those that are set."""
    facts: list[tuple[str, object]] = []
    gib = j.get("state_gib_per_gpu")
    if gib:
        facts.append(("ckpt size", f"{gib:g} GiB per GPU (written when preempted)"))
    sizing = j.get("sizing")
    if isinstance(sizing, dict):
        facts.append(("sized by", sizing_line(sizing)))
    return facts


def type_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The GPU type a running job got and why, and a sized job's plan, from the reason
    the service gave it when it started ('started: GPU type H100: ...; plan 4 x ...')."""
    reason = str(j.get("reason") or "")
    head, _, note = reason.partition(": ")
    if head not in ("started", "resumed") or not note:
        return []
    facts: list[tuple[str, object]] = []
    if note.startswith("plan "):
        why, plan = "", note.removeprefix("plan ")
    else:
        why, _, plan = note.partition("; plan ")
    if why.startswith("GPU type "):
        facts.append(("GPU type", why.removeprefix("GPU type ")))
    if plan:
        facts.append(("plan", plan))
    return facts


def sizing_line(s: dict[str, Any]) -> str:
    """'llama-3-8b inference bf16, context 2048, batch 8, 1,000,000 tokens'."""
    raw = s.get("shape")
    shape: dict[str, Any] = raw if isinstance(raw, dict) else {}
    model = s.get("model") or shape.get("name") or "custom shape"
    task = s.get("task") or "inference"
    parts = [f"{model} {task} {s.get('precision') or 'bf16'}"]
    if task == "training":
        parts.append(
            f"seq {s.get('seq_len', '-')} x micro-batch {s.get('batch', '-')} "
            f"x accum {s.get('grad_accum', '-')}"
        )
    else:
        parts.append(f"context {s.get('context', '-')}, batch {s.get('batch', '-')}")
    if isinstance(s.get("tokens"), int | float):
        parts.append(f"{s['tokens']:,.0f} tokens")
    if isinstance(s.get("deadline_s"), int | float):
        parts.append(f"within {_span(s['deadline_s'])}")
    return ", ".join(parts)


def _gpus(j: dict[str, Any]) -> str:
    # a sized job holds the count the core chose for its type, not the one submitted
    count = len(j["gpus"]) if j.get("gpus") else j.get("gpu_count", "?")
    model = j.get("gpu_model") or j.get("gpu_type")
    mem = j.get("gpu_mem_mib")
    if mem is not None:  # part of one GPU, by memory
        return f"{_mib(mem)} of {model or 'one GPU'}"
    milli = j.get("gpu_milli", 1000)
    if isinstance(milli, int) and 0 < milli < 1000:  # part of one GPU, by share
        share = f"{milli / 1000:g}"
        return f"{share} of {model}" if model else share
    low = j.get("gpu_count_min")
    if low is not None:  # elastic: what it holds now, of its range
        count = f"{count} (elastic {low}..{j.get('gpu_count', '?')})"
    return f"{count} x {j['gpu_model']}" if j.get("gpu_model") else str(count)


def _mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib / 1024:.1f}GiB" if mib >= 1024 else f"{mib}MiB"


def _placement(j: dict[str, Any]) -> str:
    return ", ".join(f"{g.get('node')}:{g.get('index')}" for g in j.get("gpus") or [])


def _age(j: dict[str, Any], now: float) -> str:
    """Time waiting for queued jobs, time running for running ones, run time for ended ones."""
    state, start, end = j.get("state"), j.get("started_at"), j.get("ended_at")
    if state in ("pending", "suspended"):
        since = j.get("submitted_at")
        return "-" if since is None else _span(now - since)
    if start is None:
        return "-"
    return _span((end if end is not None else now) - start)


def _span(seconds: float) -> str:
    """Compact duration: 42s, 5m07s, 3h02m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} ({_span(now - at)} ago)"


def clock(now: float) -> str:
    return datetime.fromtimestamp(now).strftime("%H:%M:%S")


def _num(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _memory(used_mib: Any, total_mib: Any) -> str:
    used = "-" if used_mib is None else f"{used_mib / 1024:.1f}"
    total = "-" if total_mib is None else f"{total_mib / 1024:.1f}"
    return f"{used}/{total}"


def _node_state(node: dict[str, Any]) -> str:
    """A node's state, with the GPUs out of the pool and why (`gpus_out`)."""
    state = str(node.get("state", "?"))
    out = node.get("gpus_out") or []
    return "; ".join([state, *(str(o.get("reason", "")) for o in out)])


def _agent(agent: dict[str, Any]) -> str:
    """The node's agent in a word or a reason: leaving, its storage check, or where it runs."""
    if not agent:
        return "-"
    if agent.get("leaving"):
        return "leaving"
    storage = agent.get("storage")
    if storage not in (None, "ok", "unknown"):
        return f"storage: {storage}"
    return str(agent.get("where") or "-")


def node_table(nodes: list[dict[str, Any]]) -> str:
    """`gpupool nodes`: each node's model, site, labels, GPUs, busy GPUs, state and agent."""
    rows = [
        [
            n.get("name", "?"),
            n.get("gpu_model") or "-",
            n.get("site") or "-",
            printable(",".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items())))
            or "-",
            len(n.get("gpus") or []),
            sum(g.get("job_id") is not None for g in n.get("gpus") or []),
            _node_state(n),
            _agent(n.get("agent") or {}),
        ]
        for n in nodes
    ]
    return (
        table.render(["node", "model", "site", "labels", "GPUs", "busy", "state", "agent"], rows)
        if rows
        else "no nodes"
    )


def token_created_text(made: dict[str, Any]) -> str:
    """`gpupool token create`: who the token is for, until when, and the secret, shown once."""
    scope = f"team {made.get('team')}" if made.get("role") == "team" else made.get("role")
    until = made.get("expires_at")
    return "\n".join(
        [
            f"token {printable(str(made.get('name')))} (id {made.get('id')}) for {scope}, "
            + ("never expires" if until is None else f"expires {stamp(until)}"),
            f"  {made.get('token')}",
            "shown once: store it now (export GPUPOOL_TOKEN=... or the config file's token:)",
        ]
    )


def token_table(tokens: list[dict[str, Any]]) -> str:
    """`gpupool token ls`: the tokens, never their secrets."""
    if not tokens:
        return "no tokens"
    rows = [
        [
            t.get("id", "?"),
            printable(str(t.get("name") or "-")),
            t.get("role") or "-",
            printable(str(t.get("team") or "-")),
            t.get("state") or "-",
            stamp(t.get("created_at")),
            "never" if t.get("expires_at") is None else stamp(t.get("expires_at")),
            printable(str(t.get("created_by") or "-")),
        ]
        for t in tokens
    ]
    headers = ["id", "name", "role", "team", "state", "created", "expires", "by"]
    return table.render(headers, rows)


def audit_table(rows: list[dict[str, Any]]) -> str:
    """`gpupool audit`: one line per row of the trail, newest first as the server sends it."""
    if not rows:
        return "no audit rows"
    cells = [
        [
            r.get("id", "?"),
            stamp(r.get("at_s")),
            printable(str(r.get("token") or "-")),
            printable(_who(r)),
            printable(str(r.get("action") or "-")),
            printable(f"{r.get('method') or ''} {r.get('path') or ''}".strip() or "-"),
            "-" if r.get("status") is None else r["status"],
            printable(str(r.get("client") or "-")),
            _cut(printable(str(r.get("detail") or "")), 60),
        ]
        for r in rows
    ]
    headers = ["id", "at", "token", "role", "action", "request", "status", "from", "detail"]
    return table.render(headers, cells)


def service_table(services: list[dict[str, Any]]) -> str:
    """`gpupool service ls`: each service's serving replicas, bounds, load and p99."""
    if not services:
        return "no services"
    rows = [
        [
            s["name"],
            s["team"],
            f"{sum(r['state'] == 'running' for r in s['replicas'])}/{s['target_replicas']}",
            f"{s['min_replicas']}..{s['max_replicas']}",
            _num(s.get("rps")),
            _num(s.get("p99_ms"), "{:.0f}"),
            f"{s['slo_p99_ms']:g}",
        ]
        for s in services
    ]
    return table.render(["service", "team", "serving", "bounds", "rps", "p99 ms", "SLO ms"], rows)


def service_text(s: dict[str, Any]) -> str:
    """What `gpupool service show` prints: the service, its replicas and its events."""
    running = sum(r["state"] == "running" for r in s["replicas"])
    starting = sum(r["state"] == "starting" for r in s["replicas"])
    lines = [
        f"service {s['name']}  team {s['team']}" + (f"  model {s['model']}" if s["model"] else ""),
        f"replicas: {running} serving, {starting} starting of {s['target_replicas']} wanted "
        f"(bounds {s['min_replicas']}..{s['max_replicas']})",
        f"rps: {_num(s.get('rps'))}  p99: {_num(s.get('p99_ms'), '{:.0f}')} ms  "
        f"(SLO {s['slo_p99_ms']:g} ms, {s['replica_rps']:g} rps/replica; "
        f"{s.get('replicas_reporting', 0)} reporting)",
    ]
    backoff = s.get("backoff")
    if backoff:
        when = time.strftime("%H:%M:%S", time.localtime(backoff["retry_at"]))
        last = f" (last: {backoff['last_reason']})" if backoff.get("last_reason") else ""
        lines.append(
            f"backing off: {backoff['failures']} replicas in a row failed soon after they "
            f"started{last}; the next one starts at {when} at the earliest"
        )
    rows = [
        [
            str(r["job_id"]),
            r["name"],
            r["state"],
            r["node"] or "-",
            ",".join(str(g["index"]) for g in r["gpus"]) or "-",
            r.get("url") or str(r["port"] or "-"),
            _num(r.get("rps")),
            _num(r.get("p99_ms"), "{:.0f}"),
        ]
        for r in s["replicas"]
    ]
    if rows:
        lines.append("")
        lines.append(
            table.render(["job", "replica", "state", "node", "gpu", "url", "rps", "p99 ms"], rows)
        )
    events = s.get("events") or []
    if events:
        lines.append("")
        lines.append("events:")
        for e in events[-10:]:
            stamp = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            lines.append(f"  {stamp}  {e['message']}")
    return "\n".join(lines)


def _who(r: dict[str, Any]) -> str:
    role = r.get("role")
    if role is None:
        return "-"
    return f"team {r.get('team')}" if role == "team" else str(role)


def stamp(at: Any) -> str:
    if not isinstance(at, int | float):
        return "-"
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Controls (C0, DEL, C1: ESC starts every terminal escape), format characters (bidi
overrides, zero-width ones), lone surrogates and line/paragraph separators."""


def printable(text: str) -> str:
    """text with every control or format character written as an escape (\\x1b, \\n,
    \\u202e), so it shows as what it is instead of acting on the terminal."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif unicodedata.category(ch) in _UNPRINTABLE:
            n = ord(ch)
            out.append(
                f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def _safe(row: list[object]) -> list[object]:
    """A table row with its text cells made printable()."""
    return [printable(c) if isinstance(c, str) else c for c in row]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
