"""Card facts the data may leave out, from the sizing catalogue: a card's memory and a GPU
type's price per hour (the data's own price wins where it gives one)."""

from __future__ import annotations

import functools

from gpupool.reports.review.period import Period
from gpupool.reports.review_data import GpuRecord


def card_mem_mib(gpu: GpuRecord) -> int:
    """The card's memory: as recorded, else the catalogue's for its type (0: unknown)."""
    if gpu.mem_total_mib > 0:
        return gpu.mem_total_mib
    return catalogue_mem_mib(gpu.gpu_type)


@functools.lru_cache(maxsize=64)
def catalogue_price(gpu_type: str) -> float:
    """The catalogue's typical on-demand USD per GPU-hour, for types the data has no price
    for (0 for a type the catalogue does not know)."""
    from gpupool.sizing.catalog import load_catalog

    catalog = load_catalog()
    return float(catalog[gpu_type].price_usd_per_hour) if gpu_type in catalog else 0.0


@functools.lru_cache(maxsize=64)
def catalogue_mem_mib(gpu_type: str) -> int:
    from gpupool.sizing.catalog import load_catalog

    catalog = load_catalog()
    return round(catalog[gpu_type].memory_gib * 1024) if gpu_type in catalog else 0


def prices_of(p: Period) -> dict[str, float]:
    """Price per GPU-hour of each GPU type in the data: its own, else the catalogue's."""
    return {
        g.gpu_type: p.data.gpu_price_per_hour.get(g.gpu_type, catalogue_price(g.gpu_type))
        for g in p.gpus
    }
