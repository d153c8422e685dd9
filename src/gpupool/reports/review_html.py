"""The review as ONE self-contained HTML file: inline SVG charts, tables, print CSS.

Nothing in the file points outside it: charts are matplotlib SVG inlined (text drawn as
paths, so no font is needed; the DOCTYPE, RDF metadata and namespace URLs are stripped),
no script, no stylesheet or font link. Matplotlib's SVG ids are salted with a fixed string
and dates are left out, so the same review gives byte-identical HTML. Each table's cells
are written by `review_csv.cell`, so the HTML and the CSVs show the same numbers.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.errors import GpupoolError
from gpupool.reports.review import Review, Table
from gpupool.reports.review_csv import cell

SVG_SALT = "gpupool-review"
MAX_LINE_POINTS = 1500
COLOURS = ("#3b6ea8", "#e08a2c", "#7a9a3a", "#b04a5a", "#7b5ea7", "#4a9a9a", "#a07850")

CSS = """
:root { --ink: #1d2330; --muted: #5b6475; --rule: #d9dde5; --band: #f4f6f9; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  margin: 0 auto; max-width: 1180px; padding: 24px 28px 60px; line-height: 1.4; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 0 0 6px; border-bottom: 2px solid var(--ink); padding-bottom: 4px; }
.sub { color: var(--muted); margin: 0 0 16px; }
.cards { display: grid; grid-template-columns: repeat(8, 1fr); gap: 10px;
  margin: 14px 0 10px; }
.card { background: var(--band); border-radius: 6px; padding: 10px 12px; }
.card b { display: block; font-size: 18px; white-space: nowrap; }
@media (max-width: 900px) { .cards { grid-template-columns: repeat(4, 1fr); } }
.card span { color: var(--muted); font-size: 12.5px; }
.recon { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 13px;
  background: var(--band); padding: 8px 12px; border-radius: 6px; }
nav { margin: 12px 0 20px; font-size: 13.5px; }
nav a { color: #2f5d92; margin-right: 12px; text-decoration: none; white-space: nowrap; }
section { margin: 30px 0; }
section p.what { color: var(--muted); margin: 0 0 10px; font-size: 14px; }
figure { margin: 0 0 10px; }
figure svg { display: block; width: 100%; height: auto; max-height: 380px; }
.tablewrap { max-height: 420px; overflow: auto; border: 1px solid var(--rule); }
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { padding: 3px 8px; border-bottom: 1px solid var(--rule); text-align: right;
  white-space: nowrap; }
th { background: var(--band); position: sticky; top: 0; }
th:first-child, td:first-child { text-align: left; }
#t-recommendations td, #t-recommendations th { text-align: left; }
td.text { text-align: left; white-space: normal; min-width: 320px; }
ul.recs li { margin: 4px 0; }
ul.recs code { background: var(--band); padding: 0 4px; border-radius: 3px; }
.kind { display: inline-block; min-width: 130px; font-weight: 600; }
.empty { color: var(--muted); font-style: italic; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  nav { display: none; }
  section { break-before: page; page-break-before: always; margin: 0; }
  section:first-of-type { break-before: auto; page-break-before: auto; }
  .tablewrap { max-height: none; overflow: visible; border: none; }
  th { position: static; }
  figure { break-inside: avoid; page-break-inside: avoid; }
  figure svg { max-height: 300px; }
}
"""


def _figure(
    width: float = 10.0, height: float = 3.4, left: float = 0.07, bottom: float = 0.16
) -> Any:
    """A figure with fixed margins (no tight_layout: it draws twice, and this is faster)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    fig.subplots_adjust(left=left, right=0.93, top=0.88, bottom=bottom)
    return fig


def _svg(fig: Any, prefix: str) -> str:
    """The figure as inline SVG with no URL in it and ids unique to this chart."""
    import matplotlib

    with matplotlib.rc_context(
        {"svg.hashsalt": SVG_SALT, "svg.fonttype": "path", "font.family": "DejaVu Sans"}
    ):
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    ids = set(re.findall(r'\bid="([^"]+)"', text))

    def scoped(m: re.Match[str]) -> str:
        head, ident, tail = m.group(1), m.group(2), m.group(3)
        return f"{head}{prefix}-{ident}{tail}" if ident in ids else m.group(0)

    text = re.sub(r'(\bid=")([^"]+)(")', scoped, text)
    text = re.sub(r'("#)([^"]+)(")', scoped, text)
    text = re.sub(r"(url\(#)([^)]+)(\))", scoped, text)
    text = re.sub(r'\s(width|height)="[^"]*pt"', "", text, count=2)
    return text.replace("<svg", f'<svg role="img" aria-label="{prefix}"', 1)


def _style(ax: Any, title: str, ylabel: str = "") -> None:
    ax.set_title(title, fontsize=11, loc="left")
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="y", color="#e3e6ec", linewidth=0.6)
    ax.set_axisbelow(True)


def _labels(ax: Any, names: Sequence[str], rotate: bool) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60 if rotate else 0, ha="right" if rotate else "center")


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this period", ha="center", va="center", fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


# ---- one chart per section ---------------------------------------------------------------
def chart_capacity(review: Review) -> Any:
    fig = _figure(bottom=0.24 if len(review.gpus) > 8 else 0.12)
    ax = fig.add_subplot()
    rows = review.gpus
    names = [g.gpu_id for g in rows]
    x = range(len(rows))
    alloc = [g.allocated_gpu_h for g in rows]
    idle = [g.idle_gpu_h for g in rows]
    down = [g.down_gpu_h for g in rows]
    ax.bar(x, alloc, color=COLOURS[0], label="allocated")
    ax.bar(x, idle, bottom=alloc, color="#c9d3e0", label="idle")
    ax.bar(
        x,
        down,
        bottom=[a + i for a, i in zip(alloc, idle, strict=True)],
        color=COLOURS[3],
        label="down",
    )
    ax.plot(x, [g.used_gpu_h for g in rows], "o", color=COLOURS[1], ms=4, label="used (SM)")
    _labels(ax, names, len(names) > 8)
    _style(ax, "GPU-hours per card: allocated + idle + down = capacity", "GPU-hours")
    ax.legend(fontsize=8, ncols=4, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def chart_teams(review: Review) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    rows = [t for t in review.teams if t.allocated_gpu_h > 0]
    if not rows:
        _empty(ax, "allocations")
        return fig
    x = [i for i in range(len(rows))]
    ax.bar(
        [i - 0.2 for i in x],
        [t.allocated_gpu_h for t in rows],
        0.4,
        color=COLOURS[0],
        label="allocated",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [t.used_gpu_h for t in rows],
        0.4,
        color=COLOURS[1],
        label="used (SM-weighted)",
    )
    _labels(ax, [t.team for t in rows], len(rows) > 8)
    _style(ax, "Allocated vs used GPU-hours per team", "GPU-hours")
    ax.legend(fontsize=8)
    return fig


def chart_types(review: Review) -> Any:
    fig = _figure(height=3.0)
    ax = fig.add_subplot()
    rows = review.by_type
    x = list(range(len(rows)))
    ax.bar(
        [i - 0.2 for i in x],
        [t.allocated_pct for t in rows],
        0.4,
        color=COLOURS[0],
        label="allocated %",
    )
    ax.bar(
        [i + 0.2 for i in x], [t.used_pct for t in rows], 0.4, color=COLOURS[1], label="used % (SM)"
    )
    _labels(ax, [f"{t.gpu_type} ({t.gpus})" for t in rows], False)
    ax.set_ylim(0, 100)
    _style(ax, "Utilisation by GPU type (of up time)", "%")
    ax.legend(fontsize=8)
    return fig


def chart_hours(review: Review) -> Any:
    fig = _figure(height=3.0)
    ax = fig.add_subplot()
    rows = review.by_hour
    hours = [r.hour for r in rows]
    for r in rows:
        if r.window == "day":
            ax.axvspan(r.hour - 0.5, r.hour + 0.5, color="#fff3d6", zorder=0, linewidth=0)
    ax.plot(
        hours, [r.allocated_pct for r in rows], "-o", ms=3, color=COLOURS[0], label="allocated %"
    )
    ax.plot(hours, [r.used_pct for r in rows], "-o", ms=3, color=COLOURS[1], label="used % (SM)")
    ax.set_xticks(hours)
    ax.set_xlim(-0.5, 23.5)
    ax.set_ylim(0, 100)
    s = review.summary
    _style(
        ax,
        f"By local hour (UTC{s.utc_offset_h:+g} h); day {s.day_window} shaded: used "
        f"{s.day_used_pct:.1f} % by day, {s.night_used_pct:.1f} % by night",
        "%",
    )
    ax.set_xlabel("local hour of day", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def chart_jobs(review: Review) -> Any:
    fig = _figure(height=3.8, bottom=0.34)
    ax = fig.add_subplot()
    rows = sorted(review.jobs, key=lambda j: (-(j.allocated_gpu_h - j.used_gpu_h), j.job_id))[:20]
    if not rows:
        _empty(ax, "jobs")
        return fig
    x = list(range(len(rows)))
    ax.bar(x, [j.allocated_gpu_h for j in rows], color="#c9d3e0", label="allocated")
    ax.bar(x, [j.used_gpu_h for j in rows], color=COLOURS[1], label="used (SM-weighted)")
    for i, j in enumerate(rows):
        if j.never_used:
            ax.text(
                i,
                j.allocated_gpu_h,
                "never used",
                rotation=90,
                fontsize=7,
                ha="center",
                va="bottom",
                color=COLOURS[3],
            )
    _labels(ax, [j.job_id for j in rows], True)
    _style(ax, "The 20 jobs with the most held-but-unused GPU-hours", "GPU-hours")
    ax.legend(fontsize=8)
    return fig


def chart_recommendations(review: Review) -> Any:
    from gpupool.reports.review import RECOMMENDATION_KINDS

    fig = _figure(height=2.0, left=0.15, bottom=0.12)
    ax = fig.add_subplot()
    counts = [len(review.recommendations_of(k)) for k in RECOMMENDATION_KINDS]
    ax.barh(range(len(counts)), counts, color=COLOURS[0])
    ax.set_yticks(range(len(counts)))
    ax.set_yticklabels(RECOMMENDATION_KINDS)
    ax.invert_yaxis()
    for i, c in enumerate(counts):
        ax.text(c, i, f" {c}", va="center", fontsize=8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _style(ax, "Recommendations by kind")
    ax.grid(axis="x", color="#e3e6ec", linewidth=0.6)
    return fig


def chart_latency(review: Review) -> Any:
    from datetime import UTC, datetime

    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    fig = _figure(height=3.2)
    ax = fig.add_subplot()
    if not review.latency_series:
        _empty(ax, "service latency")
        return fig
    drift = {r.service: r for r in review.latency}
    for k, (svc, pts) in enumerate(review.latency_series):
        step = max(1, -(-len(pts) // MAX_LINE_POINTS))
        xs, ys = [], []
        for i in range(0, len(pts), step):
            chunk = pts[i : i + step]
            xs.append(datetime.fromtimestamp(chunk[0][0], UTC).replace(tzinfo=None))
            ys.append(sum(p for _, p in chunk) / len(chunk))
        colour = COLOURS[k % len(COLOURS)]
        ax.plot(xs, ys, "-", lw=1, color=colour, label=svc)
        row = drift[svc]
        if row.drifted:
            at = datetime.strptime(row.changed_at, "%Y-%m-%dT%H:%M:%SZ")
            ax.axvline(at, color=colour, ls="--", lw=1)
            ax.annotate(
                f"{svc}: {row.before_p99_ms:.0f} -> {row.after_p99_ms:.0f} ms",
                (at, row.after_p99_ms),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
    loc = AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(loc))  # type: ignore[no-untyped-call]
    _style(ax, "p99 latency per service (UTC); dashed: the change point", "p99 ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


def chart_wait(review: Review) -> Any:
    fig = _figure(height=3.4, bottom=0.3)
    ax = fig.add_subplot()
    rows = [w for w in review.queue_wait if w.team != "(all)"]
    if not rows:
        _empty(ax, "queued jobs")
        return fig
    x = list(range(len(rows)))
    ax.bar(
        [i - 0.2 for i in x],
        [w.mean_wait_s / 60 for w in rows],
        0.4,
        color=COLOURS[0],
        label="mean",
    )
    ax.bar(
        [i + 0.2 for i in x], [w.p95_wait_s / 60 for w in rows], 0.4, color=COLOURS[1], label="p95"
    )
    _labels(ax, [f"{w.kind}\n{w.team}" for w in rows], len(rows) > 6)
    _style(ax, "Queue wait by kind and team", "minutes")
    ax.legend(fontsize=8)
    return fig


def chart_preemptions(review: Review) -> Any:
    fig = _figure(height=2.6)
    ax = fig.add_subplot()
    rows = review.preemptions
    if not rows:
        _empty(ax, "jobs")
        return fig
    x = list(range(len(rows)))
    ax.bar(x, [p.lost_gpu_h for p in rows], color=COLOURS[3])
    for i, p in enumerate(rows):
        ax.text(
            i, p.lost_gpu_h, f"{p.preemptions} preemptions", ha="center", va="bottom", fontsize=8
        )
    _labels(ax, [p.team for p in rows], len(rows) > 8)
    _style(ax, "GPU-hours lost to preemption per team", "GPU-hours")
    return fig


def chart_reasons(review: Review) -> Any:
    fig = _figure(height=2.6, left=0.15, bottom=0.1)
    ax = fig.add_subplot()
    rows = review.wait_reasons
    if not rows:
        _empty(ax, "waiting")
        return fig
    ax.barh(range(len(rows)), [r.wait_h for r in rows], color=COLOURS[4])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.reason for r in rows])
    ax.invert_yaxis()
    _style(ax, "Hours waited by reason code")
    ax.grid(axis="x", color="#e3e6ec", linewidth=0.6)
    return fig


def chart_cost(review: Review) -> Any:
    fig = _figure(height=3.0)
    ax = fig.add_subplot()
    rows = review.cost_by_type
    x = list(range(len(rows)))
    used = [c.allocated_cost - c.held_unused_cost for c in rows]
    held = [c.held_unused_cost for c in rows]
    free = [c.unallocated_cost for c in rows]
    ax.bar(x, used, color=COLOURS[2], label="allocated and used")
    ax.bar(x, held, bottom=used, color=COLOURS[1], label="held, unused")
    ax.bar(
        x,
        free,
        bottom=[u + h for u, h in zip(used, held, strict=True)],
        color="#c9d3e0",
        label="nobody held",
    )
    _labels(ax, [c.gpu_type for c in rows], False)
    _style(ax, "GPU cost by type at its price per GPU-hour", "USD")
    ax.legend(fontsize=8)
    return fig


def chart_energy(review: Review) -> Any:
    fig = _figure(height=3.0)
    ax = fig.add_subplot()
    rows = review.energy_by_hour
    ax.bar([e.hour for e in rows], [e.kwh for e in rows], color=COLOURS[5], label="kWh")
    ax.set_xticks([e.hour for e in rows])
    _style(ax, f"Electricity by local hour (tariff {review.summary.tariff or 'none'})", "kWh")
    ax.set_xlabel("local hour of day", fontsize=9)
    if any(e.price_per_kwh for e in rows):
        ax2 = ax.twinx()
        ax2.plot(
            [e.hour for e in rows],
            [e.price_per_kwh for e in rows],
            "-",
            color=COLOURS[3],
            lw=1.2,
            label="price per kWh",
        )
        ax2.tick_params(labelsize=8)
        ax2.set_ylabel(f"{review.summary.currency} per kWh", fontsize=9)
        ax2.set_ylim(bottom=0)
        ax2.spines["top"].set_visible(False)
    return fig


# ---- sections ----------------------------------------------------------------------------
SECTIONS: tuple[tuple[str, str, str, Callable[[Review], Any]], ...] = (
    (
        "recommendations",
        "Recommendations",
        "What to change, each with its measured evidence; the thresholds are the rules at the "
        "end of the review.",
        chart_recommendations,
    ),
    (
        "reconciliation_gpus",
        "Capacity, allocated, idle and down",
        "Each card's period split exactly: what jobs held (by share), what was up but held by "
        "nobody, and what was down. The columns in milli-GPU x ms add up without rounding.",
        chart_capacity,
    ),
    (
        "utilisation_by_type",
        "Utilisation by GPU type",
        "Allocated: share of up time held by jobs. Used: SM utilisation over up time "
        "(SM-weighted GPU-hours).",
        chart_types,
    ),
    (
        "teams",
        "Allocated vs used per team",
        "Team GPU-hours sum exactly to the cluster's allocated hours; used is the SM-weighted "
        "share of the team's jobs' cards; idle cost is held-but-unused hours at the GPU price.",
        chart_teams,
    ),
    (
        "utilisation_by_hour",
        "Utilisation by hour of day",
        "Summed over the period per local hour; the day window is shaded.",
        chart_hours,
    ),
    (
        "jobs",
        "Allocated vs used per job",
        "SM % and memory per card, attributed by share where a card was shared (-1: no sample "
        "covered the job). Idle cost: held-but-unused GPU-hours at the GPU price.",
        chart_jobs,
    ),
    (
        "latency",
        "Service latency",
        "p99 per service; a change point (ruptures) where the level moved and stayed.",
        chart_latency,
    ),
    (
        "queue_wait",
        "Queueing: wait by kind and team",
        "Submit to first start (jobs still waiting count to the end of the period).",
        chart_wait,
    ),
    (
        "preemptions",
        "Preemptions and work lost",
        "GPU-hours of work thrown away since each preempted job's last checkpoint.",
        chart_preemptions,
    ),
    (
        "wait_reasons",
        "Why jobs waited",
        "Seconds of waiting by the scheduler's reason code.",
        chart_reasons,
    ),
    (
        "cost_by_type",
        "Cost: GPU-hours by type",
        "Capacity at the GPU price per hour, split into used, held-but-unused and unheld.",
        chart_cost,
    ),
    (
        "energy_by_hour",
        "Cost: electricity",
        "kWh from the cards' power samples x time x PUE (or the jobs' own energy when samples "
        "have no power), at the tariff's price and carbon for each local hour.",
        chart_energy,
    ),
)


def _table(table: Table) -> str:
    if not table.rows:
        return '<p class="empty">nothing in this period</p>'
    cols = table.columns()
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for values in table.values():
        tds = []
        for c, v in zip(cols, values, strict=True):
            klass = ' class="text"' if c == "evidence" else ""
            tds.append(f"<td{klass}>{html.escape(cell(v))}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return (
        f'<div class="tablewrap"><table id="t-{table.name}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _summary(review: Review) -> str:
    s = review.summary
    r = review.reconciliation

    def card(value: str, label: str) -> str:
        return (
            f'<div class="card"><b>{html.escape(value)}</b><span>{html.escape(label)}</span></div>'
        )

    carbon = f"{s.carbon_kg:,.1f} kg CO2e" if s.carbon_kg is not None else "no carbon data"
    cards = [
        card(f"{s.days:g} days", f"{_when(s.period_from)} to {_when(s.period_to)} UTC"),
        card(f"{s.gpus} GPUs", f"{s.capacity_gpu_h:,.1f} capacity GPU-hours"),
        card(f"{s.allocated_pct:.1f} %", "of up time allocated"),
        card(f"{s.used_pct:.1f} %", "of up time used (SM-weighted)"),
        card(f"{s.down_pct:.1f} %", "of capacity down"),
        card(f"{s.gpu_cost:,.2f}", f"GPU cost; {s.held_unused_cost:,.2f} held but unused"),
        card(f"{s.energy_kwh:,.1f} kWh", f"{s.energy_cost:,.2f} {s.currency}; {carbon}"),
        card(str(s.recommendations), "recommendations"),
    ]
    recon = (
        f"allocated {r.gpu_hours(r.allocated):,.3f} + idle {r.gpu_hours(r.idle):,.3f} + down "
        f"{r.gpu_hours(r.down):,.3f} = capacity {r.gpu_hours(r.capacity):,.3f} GPU-hours "
        f"(exact: {r.allocated} + {r.idle} + {r.down} = {r.capacity} milli-GPU x ms); "
        f"teams sum to {sum(v for _, v in r.by_team)}"
    )
    return f'<div class="cards">{"".join(cards)}</div><p class="recon">{html.escape(recon)}</p>'


def _when(iso_time: str) -> str:
    """'2026-11-01' for midnight, else '2026-11-01 08:30'."""
    day, clock = iso_time[:10], iso_time[11:16]
    return day if clock == "00:00" else f"{day} {clock}"


def _recommendation_list(review: Review) -> str:
    if not review.recommendations:
        return '<p class="empty">no recommendation: nothing crossed a threshold</p>'
    items = []
    for rec in review.recommendations:
        text = html.escape(rec.evidence)
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
        items.append(
            f'<li><span class="kind">{html.escape(rec.kind)}</span> '
            f"<b>{html.escape(', '.join(rec.subjects))}</b>: {text}</li>"
        )
    return f'<ul class="recs">{"".join(items)}</ul>'


def _rules(review: Review) -> str:
    from dataclasses import fields

    rows = "".join(
        f"<tr><td>{html.escape(f.name)}</td><td>{html.escape(cell(getattr(review.rules, f.name)))}"
        "</td></tr>"
        for f in fields(review.rules)
    )
    return (
        '<section id="rules"><h2>Rules</h2><p class="what">The thresholds this review used '
        "(gpupool.reports.review.ReviewRules; docs/review.md).</p>"
        f'<div class="tablewrap"><table><thead><tr><th>rule</th><th>value</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


def render_html(review: Review) -> str:
    """The review as one HTML document (a string); same review, same bytes."""
    tables = {t.name: t for t in review.tables()}
    s = review.summary
    nav = " ".join(f'<a href="#{name}">{html.escape(title)}</a>' for name, title, _, _ in SECTIONS)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>gpupool review {html.escape(s.period_from[:10])} to "
        f"{html.escape(s.period_to[:10])}</title>",
        f"<style>{CSS}</style></head><body>",
        "<header><h1>GPU pool review</h1>",
        f'<p class="sub">{html.escape(s.source)}; {html.escape(s.period_from)} to '
        f"{html.escape(s.period_to)} (UTC); local time UTC{s.utc_offset_h:+g} h, day "
        f"{html.escape(s.day_window)}</p>",
        _summary(review),
        f"<nav>{nav}</nav></header>",
    ]
    for index, (name, title, what, chart) in enumerate(SECTIONS):
        try:
            svg = _svg(chart(review), f"c{index}")
        except (ValueError, TypeError) as exc:  # a chart must never hide the tables
            raise GpupoolError(f"could not draw the {title!r} chart: {exc}") from exc
        extra = _recommendation_list(review) if name == "recommendations" else ""
        parts.append(
            f'<section id="{name}"><h2>{html.escape(title)}</h2>'
            f'<p class="what">{html.escape(what)}</p><figure>{svg}</figure>{extra}'
            f"{_table(tables[name])}</section>"
        )
    parts.append(_rules(review))
    parts.append(
        f'<footer class="sub"><p>Written by <code>gpupool report</code> from '
        f"{html.escape(s.source)} data.</p></footer>"
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_html(review: Review, path: Path) -> Path:
    """Write the review's HTML to `path` (its folder must exist) and return the path."""
    text = render_html(review)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GpupoolError(f"cannot write the review HTML to {path}: {exc.strerror}") from None
    return path
