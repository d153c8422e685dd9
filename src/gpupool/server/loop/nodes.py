"""Node liveness: nodes that leave and rejoin (the probe), cloud nodes that start and stop,
and GPUs that report unhealthy.

A node lost is out of the pool (`Scheduler.node_down`); its jobs are asked to leave with
their grace and are requeued from their checkpoint when they exit (`state.evicting`). A
node the probe lists again with a new id, or that stayed listed for `RESTORE_AFTER_S`, is
trusted again. A GPU that samples unhealthy is out of the pool alone
(`Scheduler.gpu_down`): its job leaves the same way, the node's other GPUs work on, and it
comes back when it samples healthy again."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from gpupool.ports.executor.base import Executor
from gpupool.ports.telemetry.base import GpuSample
from gpupool.scheduler import Scheduler
from gpupool.server.fleet.sites import DOWN, STARTING, CloudNodes
from gpupool.server.loop.config import FleetMap
from gpupool.server.loop.state import LoopState
from gpupool.server.store import Store


class Nodes:
    PROBE_S = 1.0
    """The probe is polled at most this often."""
    RESTORE_AFTER_S = 30.0
    """A node that lost a job but stays listed is trusted again after this long."""

    def __init__(
        self,
        state: LoopState,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        executor: Executor,
        probe: Callable[[], dict[str, str]] | None,
        cloud: CloudNodes | None,
        now: float,
    ) -> None:
        """`probe` names the nodes alive now (node name -> an id that changes when the node
        restarts); `cloud` runs the sites' cloud nodes, out of the pool until started and
        joined (from `now`)."""
        self.state = state
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.probe = probe
        self.cloud = cloud
        self.gone: dict[str, tuple[str | None, float]] = {}
        """Nodes the probe or a lost job took out: (their id then, None if unlisted; when)."""
        self.on_new_nodes: Callable[[list[str]], None] | None = None
        """Called (from the loop thread) with the nodes the cluster lists that the fleet
        does not have (joined since the server started): `gpupool serve` restarts itself
        in place to add them (running jobs are adopted)."""
        self.new_nodes: list[str] = []
        self.agents: dict[str, dict[str, Any]] = {}
        """What each node's agent said last (on Ray): see `ask_agents`."""
        self.bad_gpus: dict[tuple[int, int], str] = {}
        """GPUs out of the pool as unhealthy, [node, local GPU]: why."""
        self.index_of = {n.name: k for k, n in enumerate(fleet.cluster.nodes)}
        self.nodes_lost: dict[str, int] = defaultdict(int)
        """Times each node was lost (left the cluster, or its jobs' actors died)."""
        if cloud is not None:
            for name in cloud.status:  # out of the pool until started and joined
                self.gone[name] = (None, now)

    def alive(self) -> dict[str, str] | None:
        if self.probe is None:
            return None
        try:
            return self.probe()
        except Exception as err:  # e.g. the Ray GCS is unreachable for a while
            self.state.loop_error = f"cannot list the live nodes: {err}"
            return None

    def _check_new(self, alive: dict[str, str], now: float) -> None:
        """Nodes the cluster lists that the fleet does not have: said once, and handed to
        `on_new_nodes`."""
        known = {n.name for n in self.fleet.cluster.nodes}
        new = sorted(set(alive) - known)
        if not new or new == self.new_nodes:
            return
        self.new_nodes = new
        why = (
            f"node(s) {', '.join(new)} joined the cluster; the fleet is read at start, so the "
            "server restarts itself to add them (running jobs are adopted)"
        )
        self.store.events.add("node-joined", why, now, data={"nodes": new})
        if self.on_new_nodes is not None:
            self.on_new_nodes(new)

    def ask_agents(self, alive: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """Each node's agent (on Ray, its launcher: leaving, storage check, records, how
        it contains jobs), kept for the nodes view; {} where agents are in process."""
        ask = getattr(self.executor, "agent_status", None)
        if ask is None:
            return {}
        try:
            found: dict[str, dict[str, Any]] = ask(alive)
        except Exception as err:  # the cluster is unreachable for a while: ask again
            self.state.loop_error = f"cannot ask the nodes' agents: {err}"
            return {}
        self.agents = found
        return found

    def agent_of(self, name: str) -> dict[str, Any]:
        """The node's agent for the nodes view: where it runs, how it contains jobs, its
        storage check ("ok" or why not) and whether the machine is leaving."""
        if getattr(self.executor, "agent_status", None) is None:
            note = getattr(self.executor, "cgroups_note", "")
            return {"where": "in process", "cgroups": note, "storage": "ok", "leaving": False}
        status = self.agents.get(name)
        if status is None:
            return {"where": "no answer", "cgroups": "", "storage": "unknown", "leaving": False}
        return {
            "where": f"launcher pid {status.get('pid')}",
            "dir": status.get("dir", ""),
            "cgroups": status.get("cgroups", ""),
            "storage": status.get("storage") or "ok",
            "leaving": bool(status.get("leaving")),
        }

    def agent_reason(self, name: str) -> str:
        """Why the node's agent keeps it out of the pool ("" if it does not): the machine
        is leaving, or it cannot reach the shared storage."""
        status = self.agents.get(name) or {}
        if status.get("leaving"):
            return f"node {name} is leaving (its `gpupool node join` was stopped)"
        storage = status.get("storage")
        if storage:
            return f"node {name} cannot take work: {storage}"
        return ""

    def probe_due(self, now: float) -> bool:
        return self.probe is not None and now - self.state.last_probe >= self.PROBE_S

    def check_probe(self, now: float) -> None:
        """The probe's nodes: one no longer listed is lost, one back is trusted again."""
        self.state.last_probe = now
        alive = self.alive()
        if alive is None:
            return
        self.ask_agents(alive)
        self._check_new(alive, now)
        for node in self.fleet.cluster.nodes:
            name, now_id = node.name, alive.get(node.name)
            held_out = self.agent_reason(name)
            if held_out and now_id is not None:
                if name not in self.gone:
                    self.node_down(name, now_id, now, held_out)
                continue
            if self.cloud is not None and name in self.cloud.status:
                self._probe_cloud(name, now_id, now)
                continue
            if now_id is None:
                if name not in self.gone or self.gone[name][0] is not None:
                    self.node_down(name, None, now, f"node {name} left the cluster")
            elif name in self.gone:
                was_id, since = self.gone[name]
                if now_id != was_id or now - since >= self.RESTORE_AFTER_S:
                    del self.gone[name]
                    self._node_joined(name, now_id)
                    self.scheduler.node_up(name, now)
                    self.store.events.add(
                        "node-healthy", f"node {name} is back", now, data={"node": name}
                    )

    def _probe_cloud(self, name: str, now_id: str | None, now: float) -> None:
        assert self.cloud is not None
        state = self.cloud.state(name)
        if now_id is None and state not in (DOWN, STARTING):
            why = self.cloud.left(name, now)
            if name in self.gone:  # reclaimed: already out of the pool, nothing ran there
                self.gone[name] = (None, now)
                self.scheduler.node_down(name, now, why)
                self.store.events.add("cloud-node-down", why, now)
            else:
                self.node_down(name, None, now, why)
        elif now_id is not None and state in (DOWN, STARTING):
            why = self.cloud.joined(name, now)
            self._node_joined(name, now_id)
            self.gone.pop(name, None)
            self.scheduler.node_up(name, now)
            self.store.events.add("cloud-node-up", why, now)

    def _node_joined(self, name: str, node_id: str) -> None:
        remember = getattr(self.executor, "remember_node", None)
        if remember is not None:
            remember(name, node_id)

    def check_cloud(self, now: float) -> None:
        """Start and stop commands that ended, and started nodes that never joined."""
        assert self.cloud is not None
        for kind, message, gave_up in self.cloud.check(now):
            self.store.events.add(kind, message, now)
            for name in gave_up:  # it will not join: the core counts it down again
                self.scheduler.node_down(name, now, message)
                self.gone[name] = (None, now)

    def reclaimed(self, name: str, now: float) -> None:
        """A cloud node the core reclaims: out of the pool already, nothing starts there."""
        self.gone[name] = (None, now)

    def node_down(self, name: str, node_id: str | None, now: float, why: str) -> None:
        """The node is lost: out of the pool, its jobs asked to leave and requeued."""
        first = name not in self.gone
        self.gone[name] = (node_id, now)
        if not first:
            return
        self.nodes_lost[name] += 1
        self.store.events.add("node-lost", why, now, data={"node": name})
        for job_id in self.scheduler.node_down(name, now, why):
            row = self.store.jobs.get(int(job_id))
            self.state.evicting[job_id] = f"{why}; requeued from its checkpoint"
            if job_id in self.executor.handles():
                self.executor.preempt(job_id, row.grace_s, now)

    def check_health(self, samples: Sequence[GpuSample], now: float) -> None:
        """A GPU that samples unhealthy (an XID error, uncorrected ECC errors, gone from
        the bus, a node whose telemetry stopped answering) is out of the pool, with its
        problem as the reason; the job on it leaves with its grace and is requeued from its
        checkpoint, the node's other GPUs work on. A GPU that samples healthy again comes
        back."""
        key_of = {dev: key for key, dev in self.fleet.tele_index.items()}
        bad_now: dict[tuple[int, int], str] = {}
        for s in samples:
            key = key_of.get(s.index)
            if not s.healthy and key is not None:
                bad_now[key] = s.problem or "unhealthy"
        nodes = self.fleet.cluster.nodes
        for key in sorted(self.bad_gpus):
            if key in bad_now:
                continue
            del self.bad_gpus[key]
            k, g = key
            name, dev = nodes[k].name, self.fleet.devices[key]
            self.scheduler.gpu_up(name, g, now)
            self.store.events.add(
                "gpu-healthy",
                f"GPU {dev} of node {name} is healthy again",
                now,
                data={"node": name, "gpu": g, "device": dev},
            )
        for key, problem in sorted(bad_now.items()):
            if key in self.bad_gpus:
                continue
            k, g = key
            name, dev = nodes[k].name, self.fleet.devices[key]
            why = f"GPU {dev} of node {name} unhealthy: {problem}"
            self.bad_gpus[key] = why
            self.store.events.add(
                "gpu-unhealthy", why, now, data={"node": name, "gpu": g, "device": dev}
            )
            for job_id in self.scheduler.gpu_down(name, g, now, why):
                row = self.store.jobs.get(int(job_id))
                self.state.evicting[job_id] = f"{why}; requeued from its checkpoint"
                if job_id in self.executor.handles():
                    self.executor.preempt(job_id, row.grace_s, now)

    def gpus_out(self, name: str) -> list[tuple[int, str]]:
        """The node's GPUs out of the pool as unhealthy: (local index, why), in order."""
        k = self.index_of[name]
        return [(g, why) for (n, g), why in sorted(self.bad_gpus.items()) if n == k]

    def healthy(self, name: str) -> bool:
        """The node is in the cluster (some of its GPUs may be out: `gpus_out`)."""
        return name not in self.gone

    def lost_total(self, name: str) -> int:
        return self.nodes_lost.get(name, 0)

    def state_of(self, name: str) -> str:
        """up, lost, unhealthy (every GPU out), a cloud node's down / starting / stopping,
        or an up node's draining (jobs still run there) / drained."""
        if self.cloud is not None and name in self.cloud.status:
            state = self.cloud.state(name)
            if state != "up":
                return f"cloud-{state}"
        if name in self.gone:
            return "lost"
        gpus = self.fleet.cluster.nodes[self.index_of[name]].gpu_count
        if gpus and len(self.gpus_out(name)) == gpus:
            return "unhealthy"
        return self.scheduler.draining(name) or "up"
