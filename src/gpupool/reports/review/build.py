"""`build_review`: the review of one ReviewData, section by section (see the package doc)."""

from __future__ import annotations

from gpupool.reports.review.by_type import type_and_cost_rows
from gpupool.reports.review.capacity import card_section
from gpupool.reports.review.catalogue import prices_of
from gpupool.reports.review.energy import energy_section
from gpupool.reports.review.hours import hour_section
from gpupool.reports.review.jobs import job_usage_rows, team_rows
from gpupool.reports.review.latency import latency_section
from gpupool.reports.review.period import period_of, split_allocations
from gpupool.reports.review.queueing import queue_section
from gpupool.reports.review.recommend import recommend
from gpupool.reports.review.rows import Review
from gpupool.reports.review.rules import ReviewRules
from gpupool.reports.review.summary import summary_of
from gpupool.reports.review_data import ReviewData


def build_review(data: ReviewData, rules: ReviewRules | None = None) -> Review:
    """The review of `data` over its own period (see the package docstring). Times are read
    as Unix seconds after adding `data.origin_s` (a simulation's t=0)."""
    rules = ReviewRules() if rules is None else rules
    p = period_of(data)
    split = split_allocations(p)
    cards = card_section(p, split)
    prices = prices_of(p)
    jobs = job_usage_rows(p, split, cards, prices, rules)
    teams = team_rows(p, split, jobs, cards.alloc_total)
    type_rows, cost_rows = type_and_cost_rows(p, cards, jobs, prices)
    hours = hour_section(p, split, cards)
    latency = latency_section(p, rules)
    recs = recommend(
        p.data, rules, cards.rows, jobs, p.allocs_by_gpu, p.by_id, p.jobs, latency.drifts
    )
    queue = queue_section(p)
    energy = energy_section(p, split, cards)
    return Review(
        summary=summary_of(p, cards, hours, cost_rows, energy, recs),
        reconciliation=cards.reconciliation,
        gpus=tuple(cards.rows),
        teams=tuple(teams),
        by_type=tuple(type_rows),
        by_hour=hours.rows,
        jobs=tuple(jobs),
        recommendations=recs,
        latency=tuple(latency.rows),
        latency_series=tuple(latency.series),
        queue_wait=queue.waits,
        preemptions=tuple(queue.preemptions),
        wait_reasons=queue.reasons,
        cost_by_type=tuple(cost_rows),
        energy_by_hour=tuple(energy.rows),
        rules=rules,
    )
