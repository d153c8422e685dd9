"""Where nodes sit in the network, and what a gang loses when it spans a fast domain.

Nodes carry labels (`rack=r1`). A topology level is a label key; the fleet lists its
levels narrowest first (e.g. `nvlink`, `rack`, `block`). The nodes that share a level's
value form a domain of that level. A gang (a job wider than a node) that asks for a
level as required waits for one domain of it; as preferred, it takes one when it can.

The cost of spanning domains is a step-time model (shared/reference/facts.md §5,
derived there): each data-parallel step computes for `compute_s`, then all-reduces its
gradients, `2 (N-1)/N G / busbw` seconds on a ring, of which the part overlapping the
backward pass is hidden. A gang talks at the bandwidth of the narrowest domain that holds
it all, so the slower link only costs where the all-reduce is no longer hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.domain.model import Node
from gpupool.errors import SpecError

NO_DOMAIN = -1
"""A node without the level's label: in no domain of that level."""


@dataclass(frozen=True, slots=True)
class StepModel:
    """One data-parallel training step, as facts.md §5 models it. Defaults: a 13B model's
    BF16 gradients (26 GB) at 1k tokens per GPU per step on an A100 at half its BF16 rate
    (6 * 13e9 * 1024 / 156e12 = 0.51 s), overlap 0.8 (0.7-0.9 for bucketed DDP/FSDP),
    backward two thirds of the compute."""

    grad_gb: float = 26.0
    compute_s: float = 0.5
    overlap: float = 0.8
    backward_share: float = 2.0 / 3.0

    def step_s(self, gpus: int, busbw_gb_s: float) -> float:
        """Seconds per step of a `gpus`-wide ring all-reduce at `busbw_gb_s`."""
        if gpus <= 1:
            return self.compute_s
        all_reduce_s = 2.0 * (gpus - 1) / gpus * self.grad_gb / busbw_gb_s
        hidden_s = self.overlap * self.backward_share * self.compute_s
        return self.compute_s + max(0.0, all_reduce_s - hidden_s)


@dataclass(frozen=True, slots=True)
class Topology:
    """The fleet's network levels and how fast a gang talks inside each.

    levels: label keys, narrowest first. aware: placement keeps gangs inside domains (and
    packs so domains stay whole); False places as if there were no labels, the baseline
    the benefit is measured against. busbw_gb_s: per level, a ring all-reduce's bus
    bandwidth inside one domain of it, then one more entry for a gang spanning the widest
    level; empty: spanning costs nothing (no model given)."""

    levels: tuple[str, ...] = ()
    aware: bool = True
    busbw_gb_s: tuple[float, ...] = ()
    step: StepModel = StepModel()

    def __post_init__(self) -> None:
        if len(set(self.levels)) != len(self.levels):
            raise SpecError(f"topology levels {list(self.levels)}: name each level once")
        if self.busbw_gb_s and len(self.busbw_gb_s) != len(self.levels) + 1:
            raise SpecError(
                "topology links: give a bandwidth for each level and one for a gang that "
                f"spans the widest ({len(self.levels) + 1} in all)"
            )
        if any(b <= 0 for b in self.busbw_gb_s):
            raise SpecError("topology links: bandwidths must be > 0 GB/s")

    @property
    def placing(self) -> bool:
        """Placement reads the levels (they are given, and placement is aware)."""
        return bool(self.levels) and self.aware

    def speed(self, gpus: int, level: int) -> float:
        """Work per second of a `gpus`-wide gang held by one domain of `levels[level]`
        (len(levels): by none), relative to one inside a domain of the narrowest level."""
        if not self.busbw_gb_s or level == 0:
            return 1.0
        best = self.step.step_s(gpus, self.busbw_gb_s[0])
        return best / self.step.step_s(gpus, self.busbw_gb_s[level])


def domain_ids(nodes: Sequence[Node], level: str) -> npt.NDArray[np.int64]:
    """Per node, its domain's number at `level` (domains numbered by their label values
    in sorted order), or NO_DOMAIN where the node has no such label."""
    values = sorted({v for n in nodes if (v := n.label(level)) is not None})
    index = {v: k for k, v in enumerate(values)}
    ids = [index[v] if (v := n.label(level)) is not None else NO_DOMAIN for n in nodes]
    return np.array(ids, dtype=np.int64)


def spanned_level(levels: Sequence[npt.NDArray[np.int64]], nodes: Sequence[int]) -> int:
    """The index of the narrowest level one domain of which holds all of `nodes`
    (`levels`: each level's `domain_ids`); len(levels) when none does."""
    for k, ids in enumerate(levels):
        first = int(ids[nodes[0]])
        if first != NO_DOMAIN and all(int(ids[n]) == first for n in nodes[1:]):
            return k
    return len(levels)
