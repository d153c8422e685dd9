"""Which network domains a gang may take, and in what order: the topology half of
placement (domain/topology.py has the levels and the cost of spanning them).

A gang that asks for a level takes the smallest domain of it that has room (the fewest
idle nodes that still fit it, so the big domains stay whole for the gangs that need
them); one that asks for nothing still gets one domain when one has room, else idle
nodes from the fullest domains first. Nothing here runs unless the fleet has levels
and placement is topology-aware (`Topology.placing`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import BoolArray, ClusterState, IntArray
from gpupool.domain.topology import NO_DOMAIN


def domain_masks(
    state: ClusterState, job: JobSpec, idle: BoolArray, level: str
) -> Iterator[BoolArray]:
    """The domains of `level` with at least the gang's whole nodes idle, smallest room
    first (then fewest nodes, then the domain's order); each as a node mask."""
    levels = state.topology.levels
    if level not in levels:
        return
    ids = state.level_ids[levels.index(level)]
    full = job.gpu_count // max(1, state.max_gpus_per_node)
    labelled = ids != NO_DOMAIN
    if not labelled.any():
        return
    count = int(ids.max()) + 1
    room = np.bincount(ids[idle & labelled], minlength=count)
    size = np.bincount(ids[labelled], minlength=count)
    fitting = [d for d in range(count) if room[d] >= full and room[d] > 0]
    for d in sorted(fitting, key=lambda d: (int(room[d]), int(size[d]), d)):
        yield ids == d


def shared_by(state: ClusterState, level: str, nodes: tuple[int, ...]) -> bool:
    """Whether one domain of `level` holds all of `nodes`."""
    levels = state.topology.levels
    if level not in levels:
        return False
    ids = state.level_ids[levels.index(level)]
    first = int(ids[nodes[0]])
    return first != NO_DOMAIN and all(int(ids[n]) == first for n in nodes)


def fullest_first(state: ClusterState, nodes: IntArray) -> list[int]:
    """`nodes` (idle ones) ordered so a spread gang takes from the domains with the least
    room first, narrowest level first: the roomy domains stay whole."""
    if not state.topology.placing or nodes.size == 0:
        return [int(n) for n in nodes]
    idle = state.idle_nodes()
    keys: list[IntArray] = []
    for ids in state.level_ids:
        labelled = ids != NO_DOMAIN
        count = int(ids.max()) + 1 if labelled.any() else 1
        room = np.bincount(ids[idle & labelled], minlength=count)
        keys.append(np.where(labelled[nodes], room[np.maximum(ids[nodes], 0)], 1 << 30))
    # np.lexsort sorts by its last key first: the narrowest level's room leads, then the
    # node's index (the order a topology-blind gang takes them in).
    order = np.lexsort((nodes, *reversed(keys)))
    return [int(nodes[k]) for k in order]


def roomiest_domain(state: ClusterState, level: str, allowed: BoolArray) -> int:
    """The most idle nodes any one domain of `level` has among `allowed` nodes."""
    levels = state.topology.levels
    if level not in levels:
        return 0
    ids = state.level_ids[levels.index(level)]
    mask = allowed & state.idle_nodes() & (ids != NO_DOMAIN)
    if not mask.any():
        return 0
    return int(np.bincount(ids[mask]).max())


def packing_tie_break(state: ClusterState, top: IntArray) -> IntArray:
    """Among equally scored nodes, those whose narrowest domain has the least room: a
    one-node job fills a domain already in use before it opens an idle one."""
    ids = state.level_ids[0]
    labelled = ids != NO_DOMAIN
    if not labelled[top].any():
        return top
    room = np.bincount(ids[state.idle_nodes() & labelled], minlength=int(ids.max()) + 1)
    rooms = np.where(labelled[top], room[np.maximum(ids[top], 0)], 1 << 30)
    kept: IntArray = top[rooms == rooms.min()]
    return kept
