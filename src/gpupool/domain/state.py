"""Mutable cluster state with incremental indexes of free capacity.

Policies read it; only the engine changes it, through `allocate` and `release`, after
`validate` has accepted the plan. Arrays are indexed by node position in the cluster.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpupool.domain.colocation import PairAdmission
from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, NodeShare, Placement
from gpupool.domain.topology import Topology, domain_ids
from gpupool.errors import ConflictError, PlanRejected

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FreeKey = tuple[int, int, tuple[int, ...]]
"""(model id, CPU milli left, free GPU shares in ascending order) of one node."""

NO_GPU = -1
"""Marks a GPU slot a node does not have, so that `left >= request` never holds there."""


def affinity_tag(job: JobSpec) -> str | None:
    """The kind of GPU demand a job has, as GPU-clustering groups them."""
    if job.gpu_count == 0:
        return None
    if job.shares_gpu:
        return "share-gpu"
    return f"{job.gpu_count}-gpu"


class ClusterState:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        nodes = cluster.nodes
        n = len(nodes)
        width = max(1, cluster.max_gpus_per_node)
        self.node_count = n
        self.max_gpus_per_node = cluster.max_gpus_per_node
        self.gpu_count: IntArray = np.array([nd.gpu_count for nd in nodes], dtype=np.int64)
        self.cpu_capacity: IntArray = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64)
        self.mem_capacity: IntArray = np.array([nd.mem_mib for nd in nodes], dtype=np.int64)
        self.cpu_left: IntArray = self.cpu_capacity.copy()
        self.mem_left: IntArray = self.mem_capacity.copy()
        self.gpu_left: IntArray = np.full((n, width), NO_GPU, dtype=np.int64)
        for i, nd in enumerate(nodes):
            self.gpu_left[i, : nd.gpu_count] = MILLI_PER_GPU
        self.whole_free: IntArray = self.gpu_count.copy()
        self.max_free: IntArray = np.where(self.gpu_count > 0, MILLI_PER_GPU, NO_GPU)
        """The largest free share on any of the node's GPUs: a one-GPU share fits there."""
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.tie_rank: IntArray = np.arange(n, dtype=np.int64)
        """Order in which equally scored nodes win; a run may shuffle it with its seed."""
        self.models: tuple[str, ...] = tuple(sorted({nd.gpu_model for nd in nodes}))
        model_index = {m: k for k, m in enumerate(self.models)}
        self.model_id: IntArray = np.array(
            [model_index[nd.gpu_model] for nd in nodes], dtype=np.int64
        )
        # Python mirrors of the per-node GPU rows: per-node scoring reads these, not numpy.
        self.gpu_rows: list[tuple[int, ...]] = [(MILLI_PER_GPU,) * nd.gpu_count for nd in nodes]
        """Each GPU's free share as placement sees it: 0 on a GPU that is out."""
        self.free_rows: list[tuple[int, ...]] = list(self.gpu_rows)
        """Each GPU's free share as allocated (an out GPU's too, while its jobs leave)."""
        self.out_gpus: list[frozenset[int]] = [frozenset()] * n
        """Per node, the GPUs out of service (failed): nothing new is placed on them."""
        self.free_keys: list[FreeKey] = []
        """Every distinct `FreeKey` seen, by id. Append-only and shared with copies, so an
        id means the same key everywhere: a score that reads only these can be kept by id."""
        self._free_ids: dict[FreeKey, int] = {}
        self.free_id: IntArray = np.array([self._free_id(i) for i in range(n)], dtype=np.int64)
        """Each node's id in `free_keys`; nodes with one id have the same free resources."""
        self.affinity: list[dict[str, int]] = [{} for _ in nodes]
        """Per node, how many running jobs of each `affinity_tag` hold GPUs there."""
        self.placements: dict[str, Placement] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.total_gpu_milli = int(self.gpu_count.sum()) * MILLI_PER_GPU
        self.used_gpu_milli = 0
        self._model_masks: dict[frozenset[str], BoolArray] = {}
        # Co-location: how many online-inference and other jobs share each GPU.
        self.online_on_gpu: IntArray = np.zeros_like(self.gpu_left)
        self.other_on_gpu: IntArray = np.zeros_like(self.gpu_left)
        self.colocate = False
        """When set (before anything is placed), the co-location rule holds: online
        inference shares a GPU only with online inference (at most `share_cap` replicas per
        GPU when that is set); nothing else joins it. Unset, the per-GPU job counts are not
        kept (a trace replay such as the FGD fill has no job kinds)."""
        self.share_cap: int | None = None
        """At most this many online replicas per GPU (setting it also sets `colocate`)."""
        self.no_new_sharer: BoolArray | None = None
        """[node, gpu]: cards whose measured SM utilisation (averaged over the core's
        window) is above the bound: they take no new sharer. None: nothing measured."""
        self.measured_free_mib: IntArray | None = None
        """[node, gpu]: GPU memory free as last measured (-1 where unknown)."""
        self.card_mem_mib: IntArray | None = None
        """[node, gpu]: each card's memory as last measured (0 where unknown)."""
        self.one_team_per_card = False
        """When set (before anything is placed), the jobs sharing a card are of one team:
        MPS serves one user per card at a time, and teams run as their own users."""
        self.team_on_gpu: IntArray = np.full_like(self.gpu_left, -1)
        """[node, gpu]: the team id (`team_ids`) of the jobs on the card; -1 when empty.
        Kept only while `one_team_per_card` is set."""
        self.team_ids: dict[str, int] = {}
        """Append-only and shared with copies, like `free_keys`: an id means one team."""
        self.pair_admission: PairAdmission | None = None
        """When set (before anything is placed), a sharing job joins a card holding other
        sharers only if it also admits the pair (after the rules above); `sharers` is kept."""
        self.sharers: dict[tuple[int, int], tuple[str, ...]] = {}
        """(node, gpu) -> the sharing jobs on it, in arrival order; kept only while
        `pair_admission` is set."""
        self.topology = Topology()
        """The network levels placement keeps gangs inside (`set_topology`)."""
        self.level_ids: tuple[IntArray, ...] = ()
        """Per topology level (narrowest first), each node's domain id (NO_DOMAIN: none)."""

    def copy(self) -> ClusterState:
        """A scratch copy a policy may allocate on while it plans; the real state is untouched."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        for name in (
            "cpu_left",
            "mem_left",
            "gpu_left",
            "whole_free",
            "max_free",
            "free_id",
            "version",
            "online_on_gpu",
            "other_on_gpu",
        ):
            setattr(other, name, getattr(self, name).copy())
        if self.one_team_per_card:  # else never written: shared
            other.team_on_gpu = self.team_on_gpu.copy()
        other.gpu_rows = list(self.gpu_rows)
        other.free_rows = list(self.free_rows)
        other.out_gpus = list(self.out_gpus)
        other.affinity = list(self.affinity)  # copy-on-write: allocate/release replace them
        other.placements = dict(self.placements)
        other.jobs = dict(self.jobs)
        if self.pair_admission is not None:
            other.sharers = dict(self.sharers)
        return other

    # ---- read side -------------------------------------------------------------------
    def set_topology(self, topology: Topology) -> None:
        """The fleet's network levels (before anything is placed; copies share them)."""
        self.topology = topology
        self.level_ids = tuple(domain_ids(self.cluster.nodes, lv) for lv in topology.levels)

    def domains_of(self, level: str) -> IntArray | None:
        """Each node's domain id at topology `level`; None when the topology has no such level."""
        levels = self.topology.levels
        return self.level_ids[levels.index(level)] if level in levels else None

    def idle_nodes(self) -> BoolArray:
        """Nodes of the widest size with every GPU free: what a gang's whole shares need."""
        width = self.max_gpus_per_node
        mask: BoolArray = (self.whole_free == width) & (self.gpu_count == width)
        return mask

    def model_mask(self, models: frozenset[str]) -> BoolArray:
        mask = self._model_masks.get(models)
        if mask is None:
            allowed = np.array([m in models for m in self.models], dtype=np.bool_)
            mask = allowed[self.model_id] if models else np.ones(self.node_count, np.bool_)
            self._model_masks[models] = mask
        return mask

    def fits_mask(self, job: JobSpec) -> BoolArray:
        """Nodes that can host the whole job on their own."""
        ok = (self.cpu_left >= job.cpu_milli) & (self.mem_left >= job.mem_mib)
        if job.gpu_count == 0:
            return ok
        if job.gpu_models:
            ok &= self.model_mask(job.gpu_models)
        if job.gpu_milli == MILLI_PER_GPU:
            return ok & (self.whole_free >= job.gpu_count)
        if job.gpu_count == 1 and not self.share_rules:
            return ok & (self.max_free >= job.gpu_milli)
        fitting: IntArray = self.usable_gpus(job).sum(axis=1)
        return ok & (fitting >= job.gpu_count)

    def usable_gpus(self, job: JobSpec) -> BoolArray:
        """GPUs with room for one share of the job, co-location rule included."""
        usable: BoolArray = self.gpu_left >= job.gpu_milli
        if job.gpu_milli >= MILLI_PER_GPU:
            return usable
        if self.colocating:
            if job.kind is JobKind.ONLINE:
                usable &= self.other_on_gpu == 0
                if self.share_cap is not None:
                    usable &= self.online_on_gpu < self.share_cap
            else:
                usable &= self.online_on_gpu == 0
        if self.one_team_per_card:
            usable &= (self.team_on_gpu < 0) | (self.team_on_gpu == self.team_id(job.team))
        if self.no_new_sharer is not None:
            usable &= ~self.no_new_sharer
        if self.measured_free_mib is not None and self.card_mem_mib is not None:
            usable &= (self.measured_free_mib < 0) | (
                self.measured_free_mib >= self.share_mib(job, self.card_mem_mib)
            )
        if self.pair_admission is not None:
            for (i, g), ids in self.sharers.items():
                if usable[i, g] and self.pair_problem(job, ids) is not None:
                    usable[i, g] = False
        return usable

    def pair_refusals(self, job: JobSpec, nodes: BoolArray) -> list[str]:
        """Why the pair admission keeps `job` off cards of these nodes that pass every
        other rule and have room for it (one sentence per card, in card order)."""
        out: list[str] = []
        if self.pair_admission is None:
            return out
        for (i, g), ids in sorted(self.sharers.items()):
            if not nodes[i] or self.gpu_left[i, g] < job.gpu_milli:
                continue
            why = self.pair_problem(job, ids)
            if why is not None and self.colocation_problem(job, i, g) == why:
                out.append(why)
        return out

    def pair_problem(self, job: JobSpec, ids: tuple[str, ...]) -> str | None:
        """The admission's objection to `job` joining the sharers `ids` (None: none)."""
        if self.pair_admission is None or not ids:
            return None
        return self.pair_admission.problem(job, tuple(self.jobs[j] for j in ids))

    @property
    def colocating(self) -> bool:
        return self.colocate or self.share_cap is not None

    @property
    def share_rules(self) -> bool:
        """Something beyond free share decides which GPU a sharing job may use."""
        return (
            self.colocating
            or self.one_team_per_card
            or self.no_new_sharer is not None
            or (self.measured_free_mib is not None)
            or (self.pair_admission is not None)
        )

    def team_id(self, team: str) -> int:
        """A small integer per team, for `team_on_gpu` (ids are never reused)."""
        found = self.team_ids.get(team)
        if found is None:
            found = self.team_ids[team] = len(self.team_ids)
        return found

    @staticmethod
    def share_mib(job: JobSpec, card_mib: IntArray) -> IntArray:
        """The GPU memory a share asks for on cards of these sizes: its own gpu_mem_mib,
        else its share of the card."""
        if job.gpu_mem_mib is not None:
            return np.full_like(card_mib, job.gpu_mem_mib)
        need: IntArray = -(-card_mib * job.gpu_milli // MILLI_PER_GPU)
        return need

    def colocation_problem(self, job: JobSpec, node: int, gpu: int) -> str | None:
        if self.colocating:
            online, other = int(self.online_on_gpu[node, gpu]), int(self.other_on_gpu[node, gpu])
            if job.kind is JobKind.ONLINE and other:
                return "online inference may share a GPU only with online inference"
            cap = self.share_cap
            if job.kind is JobKind.ONLINE and cap is not None and online >= cap:
                return f"at most {cap} online replicas per GPU"
            if job.kind is not JobKind.ONLINE and online:
                return f"{job.kind.value} may not share a GPU with online inference"
        if job.gpu_milli >= MILLI_PER_GPU:
            return None
        if self.one_team_per_card:
            there = int(self.team_on_gpu[node, gpu])
            if there >= 0 and there != self.team_id(job.team):
                return "another team's job shares it (MPS serves one user per card at a time)"
        if self.no_new_sharer is not None and self.no_new_sharer[node, gpu]:
            return "its measured SM utilisation is above the sharing bound"
        if self.measured_free_mib is not None and self.card_mem_mib is not None:
            free = int(self.measured_free_mib[node, gpu])
            card = self.card_mem_mib[node : node + 1, gpu : gpu + 1]
            need = int(self.share_mib(job, card)[0, 0])
            if 0 <= free < need:
                return f"measured free memory {free} MiB is less than the {need} MiB asked"
        return self.pair_problem(job, self.sharers.get((node, gpu), ()))

    def _free_id(self, node: int) -> int:
        row = self.gpu_rows[node]
        key = (int(self.model_id[node]), int(self.cpu_left[node]), tuple(sorted(row)))
        free_id = self._free_ids.get(key)
        if free_id is None:
            free_id = self._free_ids[key] = len(self.free_keys)
            self.free_keys.append(key)
        return free_id

    def node_model(self, node: int) -> str:
        return self.models[int(self.model_id[node])]

    @property
    def idle_gpu_milli(self) -> int:
        return self.total_gpu_milli - self.used_gpu_milli

    # ---- write side (the engine only) ------------------------------------------------
    def validate(self, job: JobSpec, placement: Placement) -> None:
        """Refuse a plan that over-commits anything or does not match the job."""
        if job.job_id in self.placements:
            raise PlanRejected(f"job {job.job_id} is already placed")
        if placement.gpu_count != job.gpu_count:
            raise PlanRejected(
                f"job {job.job_id}: plan gives {placement.gpu_count} GPUs, "
                f"job wants {job.gpu_count}"
            )
        seen_nodes: set[int] = set()
        cpu = mem = 0
        for share in placement.shares:
            i = share.node
            if not 0 <= i < self.node_count:
                raise PlanRejected(f"job {job.job_id}: no node #{i}")
            if i in seen_nodes:
                raise PlanRejected(f"job {job.job_id}: node #{i} appears twice in the plan")
            seen_nodes.add(i)
            if share.gpu_milli != job.gpu_milli:
                raise PlanRejected(f"job {job.job_id}: plan gpu_milli differs from the job's")
            if len(set(share.gpus)) != len(share.gpus):
                raise PlanRejected(f"job {job.job_id}: a GPU is used twice on node #{i}")
            if share.gpus and job.gpu_models and not job.allows_model(self.node_model(i)):
                raise PlanRejected(
                    f"job {job.job_id}: node {self.cluster.nodes[i].name} has "
                    f"{self.node_model(i)}, job allows {sorted(job.gpu_models)}"
                )
            row = self.gpu_rows[i]
            share_rules = self.share_rules
            for g in share.gpus:
                if not 0 <= g < len(row):
                    raise PlanRejected(f"job {job.job_id}: node #{i} has no GPU {g}")
                if row[g] < share.gpu_milli:
                    raise PlanRejected(
                        f"job {job.job_id}: GPU {g} of node #{i} has {row[g]} milli free, "
                        f"plan wants {share.gpu_milli}"
                    )
                if share_rules:
                    problem = self.colocation_problem(job, i, g)
                    if problem is not None:
                        raise PlanRejected(f"job {job.job_id}: GPU {g} of node #{i}: {problem}")
            if self.cpu_left[i] < share.cpu_milli or self.mem_left[i] < share.mem_mib:
                raise PlanRejected(f"job {job.job_id}: node #{i} lacks CPU or memory")
            cpu += share.cpu_milli
            mem += share.mem_mib
        if cpu != job.cpu_milli or mem != job.mem_mib:
            raise PlanRejected(f"job {job.job_id}: plan CPU/memory do not add up to the job's")

    def allocate(self, job: JobSpec, placement: Placement) -> None:
        for share in placement.shares:
            self._apply(share, -1)
            self._count(job, share, +1)
            tag = affinity_tag(job)
            if tag is not None and share.gpus:
                counts = dict(self.affinity[share.node])
                counts[tag] = counts.get(tag, 0) + 1
                self.affinity[share.node] = counts
        self.placements[job.job_id] = placement
        self.jobs[job.job_id] = job
        self.used_gpu_milli += job.total_gpu_milli

    def release(self, job_id: str) -> Placement:
        placement = self.placements.pop(job_id, None)
        if placement is None:
            raise ConflictError(f"job {job_id} holds no GPUs; nothing to release")
        job = self.jobs.pop(job_id)
        for share in placement.shares:
            self._apply(share, +1)
            self._count(job, share, -1)
            tag = affinity_tag(job)
            if tag is not None and share.gpus:
                counts = dict(self.affinity[share.node])
                counts[tag] = counts.get(tag, 0) - 1
                if counts[tag] <= 0:
                    del counts[tag]
                self.affinity[share.node] = counts
        self.used_gpu_milli -= job.total_gpu_milli
        return placement

    def set_gpu_out(self, node: int, gpu: int, out: bool) -> bool:
        """Take GPU `gpu` of node `node` out of service (it reads as full: nothing new goes
        there; the jobs on it release it as they leave) or back in. Whether it changed."""
        if not 0 <= gpu < int(self.gpu_count[node]):
            raise ConflictError(f"node #{node} has no GPU {gpu}")
        was = self.out_gpus[node]
        now = was | {gpu} if out else was - {gpu}
        if now == was:
            return False
        self.out_gpus[node] = now
        self._show(node)
        return True

    def _count(self, job: JobSpec, share: NodeShare, sign: int) -> None:
        if self.pair_admission is not None and job.gpu_milli < MILLI_PER_GPU:
            for g in share.gpus:
                key = (share.node, g)
                ids = self.sharers.get(key, ())
                ids = (*ids, job.job_id) if sign > 0 else tuple(j for j in ids if j != job.job_id)
                if ids:
                    self.sharers[key] = ids
                else:
                    self.sharers.pop(key, None)
        if not self.colocating:
            return  # no co-location rule: nobody reads the counts
        counts = self.online_on_gpu if job.kind is JobKind.ONLINE else self.other_on_gpu
        i = share.node
        for g in share.gpus:
            counts[i, g] += sign
            if self.one_team_per_card:
                occupied = self.online_on_gpu[i, g] + self.other_on_gpu[i, g] > 0
                self.team_on_gpu[i, g] = self.team_id(job.team) if occupied else -1

    def _apply(self, share: NodeShare, sign: int) -> None:
        i = share.node
        self.cpu_left[i] += sign * share.cpu_milli
        self.mem_left[i] += sign * share.mem_mib
        if share.gpus:
            row = list(self.free_rows[i])
            for g in share.gpus:
                row[g] += sign * share.gpu_milli
            self.free_rows[i] = tuple(row)
            self._show(i)
            return
        self.free_id[i] = self._free_id(i)
        self.version[i] += 1

    def _show(self, i: int) -> None:
        """Node i's free GPU shares as placement sees them (an out GPU has none)."""
        free, out = self.free_rows[i], self.out_gpus[i]
        row = tuple(0 if g in out else m for g, m in enumerate(free)) if out else free
        self.gpu_rows[i] = row
        if row:
            self.gpu_left[i, : len(row)] = row
            self.whole_free[i] = row.count(MILLI_PER_GPU)
            self.max_free[i] = max(row)
        self.free_id[i] = self._free_id(i)
        self.version[i] += 1
