"""A realistic hand-built month of review data: 16 GPUs, four teams, ~100 jobs, a service.

Deterministic by seed. Jobs are placed first-fit on the cards in submit order; each job has
its own SM level and memory peak, sampled every 20 minutes with noise. Planted: a job that
holds a card and never uses it (`idle-holder`), two whole-card jobs that would fit on one
(`pair-a`, `pair-b`), a job that asks a whole 80 GiB card and peaks under a quarter of it
(`over-asker`), and a service (`chat`) whose p99 steps from 50 to 80 ms on day 18.
"""

from __future__ import annotations

import random

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

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
DAY = 86400.0
H = 3600.0
BUCKET_S = 1200.0
DRIFT_AT = T0 + 17 * DAY + 14 * H
CAISO_PRICE = (0.0445, 0.042, 0.0405, 0.0395, 0.04, 0.0425, 0.046, 0.0445, 0.036, 0.0305,
               0.028, 0.027, 0.0265, 0.0265, 0.0275, 0.03, 0.035, 0.043, 0.0535, 0.0625,
               0.0625, 0.0543, 0.0485, 0.046)  # fmt: skip
CAISO_CARBON = (215, 218, 220, 221, 220, 218, 205, 175, 140, 112, 96, 88, 86, 87, 92, 104,
                124, 152, 183, 205, 212, 214, 214, 214)  # fmt: skip
TEAMS = ("vision", "nlp", "speech", "recsys")
REASONS = ("Resources", "Priority", "QuotaMax", "Fragmented")


def month(seed: int = 7, days: int = 30) -> ReviewData:
    rng = random.Random(seed)
    end = T0 + days * DAY
    gpus = [GpuRecord(f"a{n}/{i}", f"a{n}", i, "A100-80GB", mem_total_mib=81920)
            for n in range(3) for i in range(4)]  # fmt: skip
    gpus += [GpuRecord(f"l0/{i}", "l0", i, "L4", mem_total_mib=23034) for i in range(4)]
    free_at = {g.gpu_id: T0 for g in gpus}
    allocs: list[Allocation] = []
    jobs: list[JobReview] = []
    levels: dict[str, tuple[float, float]] = {}  # job -> (mean SM %, peak memory MiB)

    def place(job_id: str, team: str, kind: str, count: int, gtype: str, submit: float,
              run_s: float, sm: float, mem: float, **kw: object) -> None:  # fmt: skip
        cards = sorted((free_at[g.gpu_id], g.gpu_id) for g in gpus if g.gpu_type == gtype)
        chosen = cards[:count]
        start = max(submit, chosen[-1][0])
        stop = min(end, start + run_s)
        if start >= end - H:
            jobs.append(JobReview(job_id, team, kind, count, submit, "pending",
                                  wait_s_by_reason={"Resources": end - submit}))  # fmt: skip
            return
        for _, gid in chosen:
            allocs.append(Allocation(job_id, gid, start, stop))
            free_at[gid] = stop + rng.uniform(0, 2 * H)
        wait = start - submit
        reasons = {rng.choice(REASONS): wait} if wait > 0 else {}
        jobs.append(
            JobReview(job_id, team, kind, count, submit, "completed" if stop < end else "running",
                      first_start_s=start, end_s=stop, gpu_type=gtype,
                      wait_s_by_reason=reasons, **kw)  # type: ignore[arg-type]
        )  # fmt: skip
        levels[job_id] = (sm, mem)

    # The service holds two L4s all month; the planted jobs take their cards early.
    for i in range(2):
        allocs.append(Allocation(f"chat-replica-{i}", f"l0/{i}", T0, end))
        free_at[f"l0/{i}"] = end
        jobs.append(JobReview(f"chat-replica-{i}", "nlp", "online-inference", 1, T0, "running",
                              first_start_s=T0, service="chat", model="llama-3-8b",
                              gpu_type="L4"))  # fmt: skip
        levels[f"chat-replica-{i}"] = (55.0, 19000.0)
    place("idle-holder", "vision", "training", 1, "A100-80GB", T0 + 2 * H, 10 * DAY, 0.0, 0.0)
    place("pair-a", "speech", "batch", 1, "A100-80GB", T0 + 3 * H, 4 * DAY, 30.0, 20000.0)
    place("pair-b", "speech", "batch", 1, "A100-80GB", T0 + 3 * H, 4 * DAY, 35.0, 26000.0)
    place("over-asker", "recsys", "offline-inference", 1, "A100-80GB", T0 + 4 * H, 6 * DAY,
          70.0, 15000.0, model="llama-3-8b")  # fmt: skip
    t = T0 + 5 * H
    for k in range(96):
        t += rng.expovariate(1 / (6.5 * H))
        if t >= end - 2 * H:
            break
        team = TEAMS[k % 4]
        kind = rng.choice(("training", "training", "batch", "offline-inference"))
        gtype = "L4" if rng.random() < 0.15 else "A100-80GB"
        count = rng.choice((1, 1, 1, 2, 4)) if gtype != "L4" else 1
        card = 81920 if gtype == "A100-80GB" else 23034
        place(f"{team}-{k:03d}", team, kind, count, gtype, t, rng.uniform(3 * H, 2.5 * DAY),
              rng.uniform(35, 95), rng.uniform(0.55, 0.95) * card,
              preemptions=int(rng.random() < 0.12), lost_gpu_s=rng.choice((0.0, 1800.0)),
              priority=rng.choice((0, 10)))  # fmt: skip

    down = (DownInterval("a2/0", T0 + 9 * DAY, T0 + 9 * DAY + 6 * H, "node lost"),
            DownInterval("a2/1", T0 + 9 * DAY, T0 + 9 * DAY + 6 * H, "node lost"),
            DownInterval("a2/2", T0 + 9 * DAY, T0 + 9 * DAY + 6 * H, "node lost"),
            DownInterval("a2/3", T0 + 9 * DAY, T0 + 9 * DAY + 6 * H, "node lost"))  # fmt: skip
    by_gpu: dict[str, list[Allocation]] = {}
    for a in allocs:
        by_gpu.setdefault(a.gpu_id, []).append(a)
    usage: list[UsageSample] = []
    for g in gpus:
        tdp = 400.0 if g.gpu_type == "A100-80GB" else 72.0
        spans = sorted(by_gpu.get(g.gpu_id, []), key=lambda a: a.start_s)
        downs = [(d.start_s, d.end_s) for d in down if d.gpu_id == g.gpu_id]
        tb, i = T0, 0
        while tb < end:
            if any(a <= tb < b for a, b in downs):
                tb += BUCKET_S
                continue
            while i < len(spans) and spans[i].end_s <= tb:
                i += 1
            sm = mem = 0.0
            if i < len(spans) and spans[i].start_s <= tb:
                level, peak = levels[spans[i].job_id]
                sm = max(0.0, min(100.0, level + rng.gauss(0, 4))) if level else 0.0
                mem = peak * rng.uniform(0.85, 1.0) if peak else 0.0
            power = 0.15 * tdp + 0.85 * tdp * sm / 100.0
            usage.append(UsageSample(g.gpu_id, tb, BUCKET_S, round(mem, 1), round(sm, 2),
                                     round(power, 1), 40.0 + sm / 4))  # fmt: skip
            tb += BUCKET_S
    latency = []
    tb = T0
    while tb < end:
        level = 50.0 if tb < DRIFT_AT else 80.0
        latency.append(LatencySample("chat", tb, round(level + rng.gauss(0, 2.5), 2), 40.0))
        tb += 900.0
    return ReviewData(
        source="hand-built month",
        start_s=T0,
        end_s=end,
        gpus=tuple(gpus),
        allocations=tuple(allocs),
        down=down,
        jobs=tuple(jobs),
        usage=tuple(usage),
        latency=tuple(latency),
        teams=tuple(ReviewQuota(t, {"A100-80GB": 3}, {"A100-80GB": 8}) for t in TEAMS),
        tariff=ReviewTariff("caiso-2024", CAISO_PRICE, "USD", tuple(map(float, CAISO_CARBON)), 1.3),
        gpu_price_per_hour={"A100-80GB": 1.79, "L4": 0.44},
        day_window=(8, 20),
        utc_offset_h=-8.0,
    )
