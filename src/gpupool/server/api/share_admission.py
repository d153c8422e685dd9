"""Refuse at submit a GPU share no card of the fleet could ever hold.

A job asking for GPU memory (`--gpu-mem`) larger than the largest card it may use (its
`--gpu-model`, else any model of the fleet) would wait forever: it is refused with 422
and the largest card named. A share given as a fraction (`--gpus 0.25`) fits any card.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.errors import SpecError
from gpupool.server.store import NewJob
from gpupool.sizing.catalog import Catalog


def card_mem_mib(catalog: Catalog, model: str) -> int | None:
    """One card's memory as the core sizes shares by (catalogue GiB x 1024)."""
    if model not in catalog:
        return None
    return round(catalog[model].memory_gib * 1024)


def check_share(job: NewJob, fleet_models: Iterable[str], catalog: Catalog) -> None:
    """SpecError (a 422) when the job's GPU memory exceeds every card it may land on."""
    if job.gpu_mem_mib is None:
        return
    models = sorted(set(fleet_models))
    if job.gpu_model is not None:
        models = [m for m in models if m == job.gpu_model]
    cards = {m: c for m in models if (c := card_mem_mib(catalog, m)) is not None}
    if not cards:
        return  # an unknown model is another refusal's to explain (admission)
    largest = max(cards, key=lambda m: (cards[m], m))
    if job.gpu_mem_mib > cards[largest]:
        which = "the card it asks for" if job.gpu_model is not None else "the largest card"
        raise SpecError(
            f"asks for {mib_text(job.gpu_mem_mib)} of one GPU; {which} of this fleet is "
            f"{largest} with {mib_text(cards[largest])}: ask for at most that, or for "
            "whole GPUs"
        )


def mib_text(mib: int) -> str:
    """18GiB, 512MiB, 78.8GiB: how GPU memory reads in messages and `gpupool show`."""
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    if mib >= 1024:
        return f"{mib / 1024:.1f}GiB"
    return f"{mib}MiB"
