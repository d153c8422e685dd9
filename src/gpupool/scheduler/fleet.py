"""The fleet as the core sees it: nodes grouped into pools, their health and drains, cloud
nodes and their status, the team islands of static mode, and the online reserve.

A pool is the nodes of one GPU model (of one site, when there are several). A node takes
new work while it is in its pool's mask: up (or a cloud node that joined) and not drained.
Stages read the fleet; only the core's event handlers and the cloud-burst stage change
which nodes are in their pools (`set_in_pool`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.energy.tariff import Tariff
from gpupool.errors import NotFoundError, SpecError
from gpupool.federation.topology import Topology
from gpupool.scheduler.config import SchedulerConfig, ThermalConfig
from gpupool.sizing.catalog import Catalog

DOWN, STARTING, UP, STOPPING = 0, 1, 2, 3
"""A cloud node's status: down until a Burst starts it, up once it joined (NodeUp),
stopping from its Reclaim until it has left (NodeDown)."""


def pool_key(node: Node, multi_site: bool) -> str:
    """A pool is the nodes of one GPU model (of one site, when there are several)."""
    return f"{node.cluster}/{node.gpu_model}" if multi_site else node.gpu_model


class Fleet:
    """Nodes, pools and what keeps a node from taking work. Built once per core."""

    def __init__(
        self,
        cluster: Cluster,
        state: ClusterState,
        config: SchedulerConfig,
        node_pool: Sequence[str] | None,
        pool_price: Mapping[str, float] | None,
        topology: Topology | None,
        catalog: Catalog | None,
        tariffs: Mapping[str, Tariff | None] | None,
    ) -> None:
        self.cluster = cluster
        multi_site = len({n.cluster for n in cluster.nodes}) > 1
        self.node_pool = (
            list(node_pool)
            if node_pool is not None
            else [pool_key(n, multi_site) for n in cluster.nodes]
        )
        if len(self.node_pool) != len(cluster.nodes):
            raise SpecError("node_pool must name one pool per node")
        order = list(dict.fromkeys(self.node_pool))
        self.pool_nodes: dict[str, BoolArray] = {
            key: np.array([k == key for k in self.node_pool], dtype=np.bool_) for key in order
        }
        """Each pool's nodes that take new work now (up, joined, not drained)."""
        self.pool_model = {
            k: n.gpu_model for k, n in zip(self.node_pool, cluster.nodes, strict=True)
        }
        self.pool_site = {k: n.cluster for k, n in zip(self.node_pool, cluster.nodes, strict=True)}
        self.pool_gpus = {
            key: int(state.gpu_count[mask].sum()) for key, mask in self.pool_nodes.items()
        }
        self.pool_price = dict(pool_price or {})
        self.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.team_nodes = self.islands(config.teams) if config.mode == "static" else None
        """Static partitions: the nodes each team may use. None: one shared pool."""
        self.reserve = {t: math.ceil(config.online_reserve * n) for t, n in self.pool_gpus.items()}
        """The online reserve of each pool, in GPUs, once it applies there (online_pools)."""
        self.reserve_always = config.online_reserve_on == "always"
        self.online_pools: set[str] = set()
        """Pools where online inference may run: the reserve applies in them when the
        config says `online_reserve_on: online-seen` (else in every pool from the start)."""
        self.topology = topology
        self.catalog = catalog
        self.tariffs: dict[str, Tariff | None] = dict(tariffs or {})
        self.node_site = tuple(n.cluster for n in cluster.nodes)
        self.tdp_w = np.array(
            [
                catalog[n.gpu_model].tdp_w
                if catalog is not None and n.gpu_model in catalog
                else 0.0
                for n in cluster.nodes
            ]
        )
        self.healthy = np.ones(len(cluster.nodes), dtype=np.bool_)
        self.drained: set[int] = set()
        """Nodes that take no new job; their running jobs run on."""
        self.down_why: dict[int, str] = {}
        """Why each node that is down went down (shown in waiting jobs' reasons)."""
        self.gpu_down_why: dict[tuple[int, int], str] = {}
        """Why each GPU out of service ([node, local GPU]) went out, while its node stays
        up: the state reads it as full (`ClusterState.set_gpu_out`)."""
        self.cloud_nodes: tuple[int, ...] = ()
        """Cloud node indices, in the order they are started."""
        self.cloud_status: dict[int, int] = {}

    def islands(self, teams: Sequence[TeamQuota]) -> dict[str, BoolArray]:
        """Static partitions: each team owns whole nodes covering its guarantee."""
        nodes = self.cluster.nodes
        owned = {t.team: np.zeros(len(nodes), dtype=np.bool_) for t in teams}
        for key, mask in self.pool_nodes.items():
            idx = np.flatnonzero(mask).tolist()
            per_node = nodes[idx[0]].gpu_count
            cursor = 0
            for team in teams:
                gpus = team.guaranteed.get(key, 0)
                if gpus % per_node:
                    raise SpecError(
                        f"static mode gives teams whole nodes; team {team.team}'s guarantee "
                        f"of {gpus} {self.pool_model[key]} is not a multiple of {per_node}"
                    )
                count = gpus // per_node
                owned[team.team][idx[cursor : cursor + count]] = True
                cursor += count
        return owned

    # ---- nodes ------------------------------------------------------------------------------
    def node(self, name: str) -> int:
        k = self.node_index.get(name)
        if k is None:
            raise NotFoundError(f"node {name} is not in this cluster")
        return k

    def set_in_pool(self, k: int, member: bool) -> None:
        """Whether node k takes new work in its pool now."""
        self.pool_nodes[self.node_pool[k]][k] = member

    def add_cloud(self, names: Sequence[str]) -> None:
        """Cloud nodes: out of their pools until a Burst starts them and they join."""
        self.cloud_nodes = tuple(self.node_index[n] for n in names)
        for k in self.cloud_nodes:
            self.cloud_status[k] = DOWN
            self.set_in_pool(k, False)

    def is_cloud(self, k: int) -> bool:
        return k in self.cloud_status

    def is_up(self, k: int) -> bool:
        """Up: healthy, or a cloud node that joined."""
        if k in self.cloud_status:
            return self.cloud_status[k] == UP
        return bool(self.healthy[k])

    def allowed(self, pool: str, team: str) -> BoolArray:
        """The nodes of a pool a team's job may go to now (a copy)."""
        allowed = self.pool_nodes[pool].copy()
        if self.team_nodes is not None:
            allowed &= self.team_nodes[team]
        return allowed

    # ---- the online reserve -----------------------------------------------------------------
    def online_seen(self, gpu_models: frozenset[str]) -> None:
        """Online inference may run in the pools of these models (all when empty)."""
        for key, model in self.pool_model.items():
            if not gpu_models or model in gpu_models:
                self.online_pools.add(key)

    def reserve_now(self) -> dict[str, int]:
        """The online reserve each pool keeps now: `online_reserve` of its GPUs, from the
        start (`online_reserve_on: always`) or once online inference was submitted for
        it or a service may place replicas there (`online-seen`)."""
        if self.reserve_always:
            return self.reserve
        return {t: n if t in self.online_pools else 0 for t, n in self.reserve.items()}

    # ---- cards and sites --------------------------------------------------------------------
    def card_mem_mib(self, model: str) -> int | None:
        """One card's memory, from the catalogue (as the fake fleet and the planner have it)."""
        if self.catalog is None or model not in self.catalog:
            return None
        return round(self.catalog[model].memory_gib * 1024)

    def share_milli(self, job: JobSpec, model: str) -> int | None:
        """The share of one `model` card the job takes: its GPU memory over the card's,
        rounded up to a thousandth; its gpu_milli when it gives no memory. None: the card
        is too small (or its memory unknown)."""
        if job.gpu_mem_mib is None:
            return job.gpu_milli
        card = self.card_mem_mib(model)
        if card is None or job.gpu_mem_mib > card:
            return None
        return min(MILLI_PER_GPU, -(-job.gpu_mem_mib * MILLI_PER_GPU // card))

    def transfer_s(self, job: JobSpec, pool: str) -> float:
        """Moving the job's dataset to the site of `pool`, with its GPUs held."""
        if self.topology is None or job.dataset is None or job.dataset_gb <= 0:
            return 0.0
        return self.topology.transfer_s(job.dataset, self.pool_site[pool], job.dataset_gb)

    def room_inlet_c(self, thermal: ThermalConfig, node_count: int) -> np.ndarray:
        """Each node's inlet air as configured: `thermal.inlet_c`, and `hot_inlet_c` for
        the last `hot_nodes` on-premises nodes of each pool (a hot aisle)."""
        inlet = np.full(node_count, thermal.inlet_c)
        if thermal.hot_nodes:
            cloud = set(self.cloud_nodes)
            for key in self.pool_nodes:
                idx = [k for k, p in enumerate(self.node_pool) if p == key and k not in cloud]
                if idx:
                    inlet[idx[-thermal.hot_nodes :]] = thermal.hot_inlet_c
        return inlet
