"""The live service's database as a source of the monthly review (`gpupool report --db URL`).

Reads the database only, so a review needs no running server: the cards from the fleet
the service recorded, each run's cards and interval from the jobs' events (a run starts
at `running` or `resized` and ends at the next suspension, end or resize), down time from
the nodes' events (lost, unhealthy, drained, until healthy or undrained), each job's
wait split by the reason codes its wait-reason events carry, the telemetry history
(per-card bucket means, services' p99 and rate) and the settings the service stored
(team quotas, tariff, PUE, GPU prices).

Work lost to a preemption or a loss is estimated as the GPU-seconds since the run's last
checkpoint: the run's length modulo its checkpoint interval (all of it without one).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from gpupool.errors import GpupoolError
from gpupool.reports.review_data import (
    Allocation,
    DownInterval,
    GpuRecord,
    JobReview,
    LatencySample,
    ReviewData,
    ReviewQuota,
    ReviewTariff,
    UsageSample,
)
from gpupool.server.store import EventRow, JobRow, Store, database_url
from gpupool.server.telemetry.history import REVIEW_SETTING

HISTORY_TABLES = ("jobs", "events", "gpu_minutes", "service_minutes", "fleet_gpus")
RUN_ENDS = frozenset({"suspended", "succeeded", "failed", "cancelled"})
DOWN_STARTS = {"node-lost": "lost", "node-unhealthy": "unhealthy", "node-drain": "drained"}
DOWN_ENDS = {"node-healthy": ("lost", "unhealthy"), "node-undrain": ("drained",)}
GPU_DOWN_START, GPU_DOWN_END = "gpu-unhealthy", "gpu-healthy"
"""One card of a node out of the pool and back (its `data` names the node and the card)."""
WAIT_EVENTS = frozenset({"wait-reason", "limit", "waiting"})
QUEUED = "Queued"
"""The wait of a job before the scheduler gave any reason (its first cycle)."""
EVENT_PAGE = 10_000


def _open(url: str) -> Store:
    """The store at `url`, refused clearly when it holds no gpupool schema."""
    url = database_url(url, Path("."))  # postgresql:// as the service takes it, too
    try:
        parsed = make_url(url)
    except Exception:
        raise GpupoolError(
            f"{url!r} is not a database URL; give the service's --db URL "
            "(sqlite:///PATH/gpupool.db or postgresql://...)"
        ) from None
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise GpupoolError(
            f"{url}: no such database file; give the URL of the database a `gpupool serve` "
            "wrote (by default sqlite:///STATE_DIR/gpupool.db)"
        )
    store = Store(url)
    try:
        have = store.table_names()
    except SQLAlchemyError as err:
        store.close()
        raise GpupoolError(
            f"{url}: cannot read the database ({type(err).__name__}: {err})"
        ) from None
    missing = [t for t in HISTORY_TABLES if t not in have]
    if missing:
        store.close()
        if "jobs" not in have:
            raise GpupoolError(
                f"{url} holds no gpupool schema (no jobs table); give the database of a "
                "`gpupool serve` (its --db URL)"
            )
        raise GpupoolError(
            f"{url}: the gpupool schema predates the telemetry history (no "
            f"{', '.join(missing)}); start `gpupool serve` on it once to migrate it"
        )
    return store


def _events(store: Store) -> list[EventRow]:
    out: list[EventRow] = []
    seq = 0
    while True:
        page = store.events.after(seq, limit=EVENT_PAGE)
        out.extend(page)
        if len(page) < EVENT_PAGE:
            return out
        seq = page[-1].seq


def _jobs(store: Store) -> list[JobRow]:
    out: list[JobRow] = []
    after = 0
    while True:
        page = store.jobs.list(after_id=after, limit=1000)
        out.extend(page)
        if len(page) < 1000:
            return out
        after = page[-1].id


def _state_of(e: EventRow) -> str:
    to = e.data.get("to") if isinstance(e.data, Mapping) else None
    return str(to) if to else e.kind


def _gpus_of(e: EventRow, row: JobRow) -> list[tuple[str, int]]:
    given = e.data.get("gpus") if isinstance(e.data, Mapping) else None
    raw = given if given is not None else row.gpus  # before revision 0009: the last run's
    return [(str(n), int(i)) for n, i in raw]


def _clip(a: float, b: float, lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(a, lo), min(b, hi)
    return (a, b) if b > a else None


@dataclass
class _Run:
    start_s: float
    end_s: float
    gpus: list[tuple[str, int]]
    lost: bool = False
    preempted: bool = False


def _runs(row: JobRow, events: Sequence[EventRow], end_s: float) -> list[_Run]:
    runs: list[_Run] = []
    open_run: _Run | None = None
    for e in events:
        state = _state_of(e)
        if e.kind == "resized" or state == "running":
            if open_run is not None:
                open_run.end_s = e.at_s
                runs.append(open_run)
            open_run = _Run(e.at_s, e.at_s, _gpus_of(e, row))
        elif state in RUN_ENDS and open_run is not None:
            open_run.end_s = e.at_s
            open_run.preempted = e.message.startswith("preempted")
            open_run.lost = state == "suspended" and not open_run.preempted
            runs.append(open_run)
            open_run = None
    if open_run is not None:  # still running when the database was read
        open_run.end_s = max(open_run.start_s, row.ended_at if row.ended_at else end_s)
        runs.append(open_run)
    return runs


def _code(message: str) -> str:
    head = message.split(":", 1)[0].strip()
    return head if head.isalnum() and head[:1].isupper() else QUEUED


def _waits(
    row: JobRow, events: Sequence[EventRow], lo: float, hi: float
) -> tuple[dict[str, float], float | None]:
    """Seconds waited by reason code within [lo, hi), and the first start."""
    waits: dict[str, float] = defaultdict(float)
    since: float | None = row.submitted_at
    code = QUEUED
    first: float | None = None

    def close(at: float) -> None:
        if since is not None:
            span = _clip(since, at, lo, hi)
            if span is not None:
                waits[code] += span[1] - span[0]

    for e in events:
        state = _state_of(e)
        if e.kind in WAIT_EVENTS and since is not None:
            close(e.at_s)
            since, code = e.at_s, _code(e.message) if e.message else QUEUED
        elif state == "running":
            close(e.at_s)
            first = e.at_s if first is None else first
            since = None
        elif state == "suspended":
            since, code = e.at_s, QUEUED
        elif state in ("succeeded", "failed", "cancelled"):
            close(e.at_s)
            since = None
    close(row.ended_at if row.ended_at is not None else hi)
    return dict(waits), first


def _unique_names(rows: Iterable[JobRow]) -> dict[int, str]:
    """A job's id in the review: its name where no other job has it, else name-id."""
    rows = list(rows)
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        count[r.name] += 1
    return {r.id: r.name if count[r.name] == 1 else f"{r.name}-{r.id}" for r in rows}


def _share_milli(row: JobRow, card_mib: int) -> int:
    if row.gpu_count != 1:
        return 1000
    if row.gpu_mem_mib is not None and card_mib > 0:
        return max(1, min(1000, -(-row.gpu_mem_mib * 1000 // card_mib)))
    return max(1, min(1000, row.gpu_milli))


def _down(
    events: Sequence[EventRow], gpus_of_node: Mapping[str, list[str]], lo: float, hi: float
) -> list[DownInterval]:
    since: dict[tuple[str, str], float] = {}
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    card_since: dict[str, float] = {}
    for e in events:
        node = e.data.get("node") if isinstance(e.data, Mapping) else None
        if not isinstance(node, str) or node not in gpus_of_node:
            continue
        if e.kind in (GPU_DOWN_START, GPU_DOWN_END):
            card = f"{node}/{e.data.get('gpu')}"
            if card not in gpus_of_node[node]:
                continue
            if e.kind == GPU_DOWN_START:
                card_since.setdefault(card, e.at_s)
            elif card in card_since:
                spans[card].append((card_since.pop(card), e.at_s, "unhealthy"))
        elif e.kind in DOWN_STARTS:
            since.setdefault((node, DOWN_STARTS[e.kind]), e.at_s)
        elif e.kind in DOWN_ENDS:
            for why in DOWN_ENDS[e.kind]:
                start = since.pop((node, why), None)
                if start is not None:
                    spans[node].append((start, e.at_s, why))
    for (node, why), start in since.items():
        spans[node].append((start, hi, why))
    for card, start in card_since.items():
        spans[card].append((start, hi, "unhealthy"))
    by_card: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for where, items in spans.items():  # a node's spans hold for each of its cards
        for gpu_id in gpus_of_node.get(where, [where]):
            by_card[gpu_id].extend(items)
    out: list[DownInterval] = []
    for gpu_id, items in by_card.items():
        merged: list[list[Any]] = []
        for a, b, why in sorted(items):
            span = _clip(a, b, lo, hi)
            if span is None:
                continue
            if merged and span[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], span[1])
            else:
                merged.append([span[0], span[1], why])
        out.extend(DownInterval(gpu_id, a, b, why) for a, b, why in merged)
    return sorted(out, key=lambda d: (d.gpu_id, d.start_s))


def _tariff(raw: Any, pue: float) -> ReviewTariff | None:
    if not isinstance(raw, Mapping):
        return None
    return ReviewTariff(
        name=str(raw["name"]),
        price_per_kwh=tuple(float(p) for p in raw["price_per_kwh"]),
        currency=str(raw.get("currency", "USD")),
        carbon_g_per_kwh=tuple(float(c) for c in raw.get("carbon_g_per_kwh") or ()),
        pue=pue,
    )


def review_from_db(url: str, start_s: float | None, end_s: float | None) -> ReviewData:
    """The review record of [start_s, end_s) from the database at `url` (None: from the
    first thing it recorded, to the last)."""
    store = _open(url)
    try:
        return _read(store, url, start_s, end_s)
    finally:
        store.close()


def _read(store: Store, url: str, start_s: float | None, end_s: float | None) -> ReviewData:
    fleet = store.nodes.fleet()
    jobs = _jobs(store)
    events = _events(store)
    settings = store.settings.get(REVIEW_SETTING) or {}
    minutes = store.history.gpu_minutes(start_s, end_s)
    served = store.history.service_minutes(start_s, end_s)
    seen = [g.first_seen_s for g in fleet] + [r.submitted_at for r in jobs]
    seen += [e.at_s for e in events[:1]] + [m.t_s for m in minutes[:1]]
    last = [g.last_seen_s for g in fleet] + [e.at_s for e in events[-1:]]
    last += [m.t_s + m.period_s for m in minutes[-1:]] + [s.t_s + s.period_s for s in served[-1:]]
    lo = start_s if start_s is not None else (min(seen) if seen else 0.0)
    hi = end_s if end_s is not None else (max(last) if last else lo)
    # What is still open (a run, a wait, a node down) is known to last until the last
    # thing the database recorded, not to the end of a period that may reach the future.
    upto = min(hi, max(last)) if last else hi
    if not hi > lo:
        raise GpupoolError(
            f"{url}: nothing recorded in the period asked for; give --from and --to around "
            "the time the service ran"
        )
    gpus = [
        GpuRecord(g.gpu_id, g.node, g.gpu_index, g.gpu_type, g.site, g.mem_total_mib) for g in fleet
    ]
    card_mib = {g.gpu_id: g.mem_total_mib for g in fleet}
    by_job: dict[int, list[EventRow]] = defaultdict(list)
    for e in events:
        if e.job_id is not None:
            by_job[e.job_id].append(e)
    names = _unique_names(jobs)
    allocations: list[Allocation] = []
    reviews: list[JobReview] = []
    for row in jobs:
        mine = by_job.get(row.id, [])
        runs = _runs(row, mine, upto)
        if row.submitted_at >= hi or (row.ended_at is not None and row.ended_at < lo):
            continue
        lost_gpu_s = 0.0
        preemptions = 0
        for run in runs:
            for node, index in run.gpus:
                gpu_id = f"{node}/{index}"
                span = _clip(run.start_s, run.end_s, lo, hi)
                if span is not None:
                    share = _share_milli(row, card_mib.get(gpu_id, 0))
                    allocations.append(Allocation(names[row.id], gpu_id, *span, share))
            if run.preempted or run.lost:
                preemptions += run.preempted
                length = run.end_s - run.start_s
                every = row.checkpoint_every_s
                since_ckpt = math.fmod(length, every) if every else length
                lost_gpu_s += since_ckpt * len(run.gpus)
        waits, first = _waits(row, mine, lo, upto)
        reviews.append(
            JobReview(
                job_id=names[row.id],
                team=row.team,
                kind=row.kind,
                gpu_count=row.gpu_count,
                submit_s=row.submitted_at,
                state=row.state,
                first_start_s=row.started_at if row.started_at is not None else first,
                end_s=row.ended_at,
                service=row.service,
                model=(row.sizing or {}).get("model") if row.sizing else None,
                gpu_mem_mib=row.gpu_mem_mib,
                gpu_type=row.gpu_model,
                priority=row.priority,
                preemptions=max(preemptions, row.preemptions),
                lost_gpu_s=lost_gpu_s,
                wait_s_by_reason=waits,
            )
        )
    gpus_of_node: dict[str, list[str]] = defaultdict(list)
    for g in fleet:
        gpus_of_node[g.node].append(g.gpu_id)
    teams = tuple(
        ReviewQuota(str(t["team"]), dict(t.get("guaranteed", {})), dict(t.get("max", {})))
        for t in settings.get("teams", ())
    )
    raw_tariff = settings.get("tariff")
    return ReviewData(
        source=f"live:{make_url(url).render_as_string(hide_password=True)}",
        start_s=lo,
        end_s=hi,
        gpus=tuple(gpus),
        allocations=tuple(sorted(allocations, key=lambda a: (a.start_s, a.gpu_id, a.job_id))),
        down=tuple(_down(events, gpus_of_node, lo, upto)),
        jobs=tuple(reviews),
        usage=tuple(
            UsageSample(
                m.gpu_id, m.t_s, m.period_s, m.mem_used_mib, m.sm_util_pct, m.power_w, m.temp_c
            )
            for m in minutes
        ),
        latency=tuple(
            LatencySample(s.service, s.t_s, s.p99_ms, s.rps) for s in served if s.p99_ms is not None
        ),
        teams=teams,
        tariff=_tariff(raw_tariff, float(settings.get("pue", 1.0))),
        gpu_price_per_hour={k: float(v) for k, v in settings.get("gpu_price_per_hour", {}).items()},
        utc_offset_h=float(raw_tariff.get("utc_offset_h", 0.0))
        if isinstance(raw_tariff, Mapping)
        else 0.0,
    )
