"""Refusals at submit: a job the fleet can never run is refused with a 422 saying what exists.

The live service's fleet is fixed when it starts: the nodes it found (the fake fleet, this
machine's GPUs, the Ray cluster's gpupool nodes) plus the cloud nodes its sites file
declares, which a burst starts later. The decision core would mark a job that fits none of
them unplaceable at once; the API says so before the job is stored, naming what the fleet
has. A cloud node counts as part of the fleet even while it is stopped, so a job only a
burst node can take is accepted.

Under the local executor a job runs on one node (one machine), so the largest node of a
model bounds a job's GPU count; under Ray (``gangs``) a job wider than a node runs as a
gang, one member per node, and the model's GPUs in all bound it. A job sized by its model
is sized per GPU type of the fleet with the planner, as the core sizes it; when no type
holds it, the refusal names the nearest option of each type (the fewest GPUs that would
hold it, against what that type has).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.domain.model import Node
from gpupool.errors import SpecError
from gpupool.sizing.catalog import Catalog, normalise
from gpupool.sizing.planner import PlanRequest, estimate, sized_options
from gpupool.sizing.request_json import plan_request_from

NEAR_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""GPU counts tried for the nearest option of a model that fits nowhere in the fleet."""


class Refused(SpecError):
    """A job the fleet can never run; the API answers 422 with this message."""


@dataclass(frozen=True)
class FleetModel:
    """One GPU model of the fleet: how many GPUs it has in all and on its largest node."""

    model: str
    gpus: int
    largest_node: str
    largest_gpus: int


@dataclass(frozen=True)
class Fleet:
    """What the service can run jobs on, cloud nodes included."""

    models: tuple[FleetModel, ...]

    @staticmethod
    def of(nodes: Iterable[Node]) -> Fleet:
        by_model: dict[str, list[Node]] = {}
        for n in nodes:
            if n.gpu_count > 0:
                by_model.setdefault(n.gpu_model, []).append(n)
        models = []
        for model in sorted(by_model):
            group = by_model[model]
            big = max(group, key=lambda n: (n.gpu_count, n.name))
            models.append(
                FleetModel(model, sum(n.gpu_count for n in group), big.name, big.gpu_count)
            )
        return Fleet(tuple(models))

    def get(self, model: str) -> FleetModel | None:
        return next((m for m in self.models if m.model == model), None)

    def text(self) -> str:
        """'2 x A100-80GB, 2 x H100'."""
        return ", ".join(f"{m.gpus} x {m.model}" for m in self.models) or "no GPUs"


def admit(
    fleet: Fleet,
    catalog: Catalog,
    *,
    gpus: int,
    gpu_model: str | None,
    sizing: Mapping[str, Any] | None,
    gangs: bool = False,
) -> None:
    """Refuse (Refused) a job the fleet can never take; return if it can. `gangs`: the
    executor runs a job across nodes (Ray), so a model's GPUs in all bound it, not its
    largest node."""
    if not fleet.models:
        return  # a fleet without GPUs runs CPU jobs only; the core says why a GPU job waits
    if gpu_model is not None and fleet.get(gpu_model) is None:
        raise Refused(_unknown_model(fleet, catalog, gpu_model))
    if sizing is not None:
        _admit_sized(fleet, catalog, plan_request_from(sizing), gangs)
        return
    if gpus == 0:
        return
    allowed = [fleet.get(gpu_model)] if gpu_model is not None else list(fleet.models)
    fits = [m for m in allowed if m is not None and _room(m, gangs) >= gpus]
    if fits:
        return
    biggest = max((m for m in allowed if m is not None), key=lambda m: _room(m, gangs))
    where = f" {gpu_model}" if gpu_model is not None else ""
    if gangs:
        raise Refused(
            f"the job asks for {gpus} GPUs; the fleet has {fleet.text()}, at most "
            f"{biggest.gpus} x {biggest.model} even across nodes. Ask for at most "
            f"{biggest.gpus} GPUs"
        )
    across = ""
    if any(m is not None and m.gpus >= gpus for m in allowed):  # on several nodes
        across = (
            ". This service runs a job on one node (its local executor runs one machine): "
            "serve on Ray (`gpupool serve --ray ADDRESS`) to run it across nodes as a gang"
        )
    raise Refused(
        f"the job asks for {gpus} GPUs on one node; the largest{where} node has "
        f"{biggest.largest_gpus} ({biggest.largest_node}: {biggest.largest_gpus} x "
        f"{biggest.model}); the fleet has {fleet.text()}{across}. Ask for at most "
        f"{biggest.largest_gpus} GPUs, or split the job"
    )


def _unknown_model(fleet: Fleet, catalog: Catalog, name: str) -> str:
    have = ", ".join(m.model for m in fleet.models)
    hint = ""
    if name in catalog and fleet.get(catalog.resolve(name)) is not None:
        hint = f" (did you mean {catalog.resolve(name)!r}?)"
    else:
        for m in fleet.models:
            if normalise(m.model) == normalise(name):
                hint = f" (did you mean {m.model!r}?)"
    return (
        f"no GPU model {name!r} in this fleet{hint}; its models: {have} ({fleet.text()}). "
        f"Give one of them as --gpu-model, or leave it out to run on any type that fits"
    )


def _room(m: FleetModel, gangs: bool) -> int:
    """The most GPUs of model `m` one job may get: its largest node's, or all (gangs)."""
    return m.gpus if gangs else m.largest_gpus


def _admit_sized(fleet: Fleet, catalog: Catalog, request: PlanRequest, gangs: bool = False) -> None:
    """A sized job: some fleet type holds it within the counts tried (on one node unless
    the executor runs gangs)."""
    types = [m.model for m in fleet.models if m.model in catalog]
    if request.gpus is not None:
        wanted = {catalog.resolve(g) for g in request.gpus if g in catalog}
        types = [t for t in types if t in wanted]
    sized = sized_options(request, catalog, types)
    for name, option in sized.items():
        m = fleet.get(name)
        if m is not None and option.count <= _room(m, gangs):
            return
    near = nearest(fleet, catalog, request, types)
    raise Refused(f"{request.shape.name} fits nowhere in this fleet: {near}")


def nearest(fleet: Fleet, catalog: Catalog, request: PlanRequest, types: Sequence[str]) -> str:
    """Per fleet type, the fewest GPUs that would hold the request, against what the
    fleet has: 'needs 4 x A100-80GB, the largest A100-80GB node has 2; or ...'."""
    parts: list[str] = []
    tried = sorted(set(request.counts))
    for m in fleet.models:
        if m.model not in types:
            why = "not in the GPU catalogue" if m.model not in catalog else "not in sizing.gpus"
            parts.append(f"{m.model}: {why}")
            continue
        gpu = catalog[m.model]
        counts = sorted(set(tried) | set(NEAR_COUNTS))
        need = next((c for c in counts if estimate(request, gpu, c).fits), None)
        if need is None:
            parts.append(f"it does not fit on up to {counts[-1]} x {m.model}")
        elif need <= m.largest_gpus and need not in tried:
            parts.append(
                f"{need} x {m.model} would hold it but the counts tried are "
                f"{', '.join(map(str, tried))} (add {need} to sizing.counts, --counts)"
            )
        else:
            parts.append(
                f"needs {need} x {m.model}, the largest {m.model} node has {m.largest_gpus}"
            )
    return "; or ".join(parts) + f" (the fleet: {fleet.text()})"
