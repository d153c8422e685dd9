"""The one registry of policies: kind (placement, queue, cycle) -> name -> factory.

Plug-ins register themselves (`@register("placement", "fgd")`) when their module is
imported; `gpupool.policies` imports every built-in one, and the registry imports none of
them. A name means one rule wherever it appears: `fifo` is strict submit order with the
head blocking, as a trace replay's queue and as a scheduling cycle's policy alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gpupool.errors import NotFoundError, SpecError

if TYPE_CHECKING:
    from gpupool.domain.engine import PlacementPolicy
    from gpupool.domain.fragmentation import FragmentationMeter


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may need beyond the cluster: the workload's fragmentation meter."""

    meter: FragmentationMeter | None = None


KINDS = ("placement", "queue", "cycle")
_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}

F = TypeVar("F", bound=Callable[..., Any])


def register(kind: str, name: str) -> Callable[[F], F]:
    """Register a policy factory under `name` (placement factories take a PolicyContext)."""
    if kind not in _REGISTRY:
        raise SpecError(f"no policy kind {kind!r}; kinds: {', '.join(KINDS)}")

    def deco(factory: F) -> F:
        _REGISTRY[kind][name] = factory
        return factory

    return deco


def names(kind: str) -> tuple[str, ...]:
    return tuple(_REGISTRY[kind])


def factories(kind: str) -> dict[str, Callable[..., Any]]:
    """The live table of one kind (read-only by convention)."""
    return _REGISTRY[kind]


def factory(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered under `name`; NotFoundError names the choices."""
    factory = _REGISTRY[kind].get(name)
    if factory is None:
        raise NotFoundError(
            f"no {kind} policy named {name!r}; choose one of: {', '.join(_REGISTRY[kind])}"
        )
    return factory


def placement_names() -> tuple[str, ...]:
    return names("placement")


def queue_names() -> tuple[str, ...]:
    return names("queue")


def cycle_names() -> tuple[str, ...]:
    return names("cycle")


def placement_policy(name: str, context: PolicyContext | None = None) -> PlacementPolicy:
    policy: PlacementPolicy = factory("placement", name)(context or PolicyContext())
    return policy


def register_placement(name: str) -> Callable[[F], F]:
    return register("placement", name)


def register_queue(name: str) -> Callable[[F], F]:
    return register("queue", name)
