"""Name -> policy factories. Modules register themselves on import."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gpupool.errors import NotFoundError

if TYPE_CHECKING:
    from gpupool.core.engine import PlacementPolicy
    from gpupool.core.fragmentation import FragmentationMeter
    from gpupool.policies.queueing import QueuePolicy


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may need beyond the cluster: the workload's fragmentation meter."""

    meter: FragmentationMeter | None = None


PlacementFactory = Callable[[PolicyContext], "PlacementPolicy"]
_PLACEMENT: dict[str, PlacementFactory] = {}
_QUEUE: dict[str, Callable[[], QueuePolicy]] = {}

_BUILTIN_MODULES = (
    "gpupool.policies.random_fit",
    "gpupool.policies.dot_product",
    "gpupool.policies.gpu_clustering",
    "gpupool.policies.gpu_packing",
    "gpupool.policies.best_fit",
    "gpupool.policies.fgd",
    "gpupool.policies.consolidate",
    "gpupool.policies.thermal",
    "gpupool.policies.queueing",
)

F = TypeVar("F")


def register_placement(name: str) -> Callable[[F], F]:
    def deco(factory: F) -> F:
        _PLACEMENT[name] = factory  # type: ignore[assignment]
        return factory

    return deco


def register_queue(name: str) -> Callable[[F], F]:
    def deco(factory: F) -> F:
        _QUEUE[name] = factory  # type: ignore[assignment]
        return factory

    return deco


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def placement_names() -> tuple[str, ...]:
    _load_builtins()
    return tuple(_PLACEMENT)


def queue_names() -> tuple[str, ...]:
    _load_builtins()
    return tuple(_QUEUE)


def placement_policy(name: str, context: PolicyContext | None = None) -> PlacementPolicy:
    _load_builtins()
    factory = _PLACEMENT.get(name)
    if factory is None:
        raise NotFoundError(
            f"no placement policy named {name!r}; choose one of: {', '.join(_PLACEMENT)}"
        )
    return factory(context or PolicyContext())


def queue_policy(name: str) -> QueuePolicy:
    _load_builtins()
    factory = _QUEUE.get(name)
    if factory is None:
        raise NotFoundError(f"no queue policy named {name!r}; choose one of: {', '.join(_QUEUE)}")
    return factory()
