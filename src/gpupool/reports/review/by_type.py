"""Utilisation and cost per GPU type: capacity, allocated and used, and what the type's
GPU-hours cost, held unused or never allocated."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.reports.review.capacity import Cards
from gpupool.reports.review.period import Period
from gpupool.reports.review.rows import CostRow, JobUsageRow, TypeRow
from gpupool.reports.review.units import gpu_h, pct, rounded


def type_and_cost_rows(
    p: Period, cards: Cards, job_rows: Sequence[JobUsageRow], prices: dict[str, float]
) -> tuple[list[TypeRow], list[CostRow]]:
    """Per GPU type: its utilisation row and its cost row."""
    type_rows = []
    cost_rows = []
    for gt in sorted({g.gpu_type for g in p.gpus}):
        rows_t = [r for r in cards.rows if r.gpu_type == gt]
        cap = sum(r.capacity_mgpu_ms for r in rows_t)
        dn = sum(r.down_mgpu_ms for r in rows_t)
        al = sum(r.allocated_mgpu_ms for r in rows_t)
        used = sum(cards.card_use[r.gpu_id].used_gpu_s for r in rows_t) / 3600.0
        type_rows.append(
            TypeRow(
                gpu_type=gt,
                gpus=len(rows_t),
                capacity_gpu_h=gpu_h(cap),
                down_gpu_h=gpu_h(dn),
                allocated_gpu_h=gpu_h(al),
                used_gpu_h=rounded(used),
                allocated_pct=pct(al, cap - dn),
                used_pct=pct(used, gpu_h(cap - dn)),
            )
        )
        price = prices.get(gt, 0.0)
        held_used = sum(min(r.used_gpu_h, r.allocated_gpu_h) for r in job_rows if r.gpu_type == gt)
        cost_rows.append(
            CostRow(
                gpu_type=gt,
                gpus=len(rows_t),
                price_per_gpu_h=price,
                price_from=(
                    "data"
                    if gt in p.data.gpu_price_per_hour
                    else ("catalogue" if price > 0 else "none")
                ),
                capacity_gpu_h=gpu_h(cap),
                allocated_gpu_h=gpu_h(al),
                used_gpu_h=rounded(used),
                capacity_cost=rounded(gpu_h(cap) * price, 2),
                allocated_cost=rounded(gpu_h(al) * price, 2),
                held_unused_cost=rounded(max(0.0, gpu_h(al) - held_used) * price, 2),
                unallocated_cost=rounded(gpu_h(cap - dn - al) * price, 2),
            )
        )
    return type_rows, cost_rows
