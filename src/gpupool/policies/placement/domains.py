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
from gpupool.domain.topology import NO_DOMAIN, spanned_level


def idle_per_domain(state: ClusterState, ids: IntArray, among: BoolArray) -> IntArray:
    """Per domain id of one level, how many of its nodes are idle and in `among`."""
    labelled = ids != NO_DOMAIN
    count = int(ids.max()) + 1 if labelled.any() else 1
    room: IntArray = np.bincount(ids[state.idle_nodes() & among & labelled], minlength=count)
    return room


def domain_masks(
    state: ClusterState, job: JobSpec, idle: BoolArray, level: str
) -> Iterator[BoolArray]:
    """The domains of `level` with at least the gang's whole nodes idle (among `idle`),
    smallest room first (then fewest nodes, then the domain's order); each as a node mask."""
    ids = state.domains_of(level)
    if ids is None or not (ids != NO_DOMAIN).any():
        return
    full = job.gpu_count // max(1, state.max_gpus_per_node)
    room = idle_per_domain(state, ids, idle)
    size = np.bincount(ids[ids != NO_DOMAIN], minlength=room.size)
    fitting = [d for d in range(room.size) if room[d] >= max(1, full)]
    for d in sorted(fitting, key=lambda d: (int(room[d]), int(size[d]), d)):
        yield ids == d


def shared_by(state: ClusterState, level: str, nodes: tuple[int, ...]) -> bool:
    """Whether one domain of `level` holds all of `nodes`."""
    ids = state.domains_of(level)
    return ids is not None and spanned_level((ids,), nodes) == 0


def _room_of(state: ClusterState, ids: IntArray, nodes: IntArray) -> IntArray:
    """Per node of `nodes`, the idle nodes of its domain at one level (unlabelled: last)."""
    room = idle_per_domain(state, ids, np.ones(ids.size, dtype=np.bool_))
    inside = ids[nodes] != NO_DOMAIN
    out: IntArray = np.where(inside, room[np.maximum(ids[nodes], 0)], 1 << 30)
    return out


def fullest_first(state: ClusterState, nodes: IntArray) -> list[int]:
    """`nodes` (idle ones) ordered so a spread gang takes from the domains with the least
    room first, narrowest level first: the roomy domains stay whole."""
    if not state.topology.placing or nodes.size == 0:
        return [int(n) for n in nodes]
    keys = [_room_of(state, ids, nodes) for ids in state.level_ids]
    # np.lexsort sorts by its last key first: the narrowest level's room leads, then the
    # node's index (the order a topology-blind gang takes them in).
    order = np.lexsort((nodes, *reversed(keys)))
    return [int(nodes[k]) for k in order]


def roomiest_domain(state: ClusterState, level: str, allowed: BoolArray) -> int:
    """The most idle nodes any one domain of `level` has among `allowed` nodes."""
    ids = state.domains_of(level)
    return 0 if ids is None else int(idle_per_domain(state, ids, allowed).max())


def packing_tie_break(state: ClusterState, top: IntArray) -> IntArray:
    """Among equally scored nodes, those whose narrowest domain has the least room: a
    one-node job fills a domain already in use before it opens an idle one."""
    ids = state.level_ids[0]
    if not (ids[top] != NO_DOMAIN).any():
        return top
    rooms = _room_of(state, ids, top)
    kept: IntArray = top[rooms == rooms.min()]
    return kept
