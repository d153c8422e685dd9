"""GPU telemetry of a Ray fleet: one small actor per node reads its own GPUs.

NVML only sees the GPUs of the machine it runs on, so each gpupool node gets a
`NodeTelemetryActor` pinned to it (num_cpus=0, num_gpus=0, hard node affinity, like the
job actors of `ray_executor`). On a node without a GPU the actor declares a fake fleet of
the node's declared model and count, as the local service does without a GPU.

`RayTelemetry` puts the nodes together behind the one `Telemetry` protocol the live
service knows: GPUs are numbered globally in fleet order (the GPUs of node k follow those
of nodes 0..k-1, as `LiveService.tele_index` expects). A node whose actor is dead or
slow reads as unhealthy GPUs, so the service's health logic drains it; a dead actor on a
live node is recreated, and the node reads healthy again once it answers. A node that
misses an answer now and then is not drained for it: its last answer stands in until it
has missed `telemetry_miss_limit` in a row (`MissCounter`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpupool.energy.powercap import SetPowerCap
from gpupool.errors import ConflictError, NotFoundError, SpecError
from gpupool.ports.telemetry.base import ApplyResult, GpuInfo, GpuSample, Telemetry, lost_sample
from gpupool.ports.telemetry.fake import FakeTelemetry, parse_fleet, parse_inlet
from gpupool.server.executors.ray import DEFAULT_NAMESPACE
from gpupool.server.executors.ray_nodes import ray_nodes
from gpupool.server.telemetry.misses import DEFAULT_MISS_LIMIT, KEY, MissCounter
from gpupool.server.telemetry.nvml import NoGpuError, NvmlTelemetry

FAKE_INLET_ENV = "GPUPOOL_FAKE_INLET"
"""A joined node's `--fake-inlet` (GPU=CELSIUS pairs), in its Ray processes' environment:
the inlet air of some of its fake GPUs."""

ACTOR_PREFIX: Final = "gpupool-telemetry-"
SAMPLE_TIMEOUT_S: Final = 2.0
"""Total wait for one round of samples: a live actor answers in milliseconds."""
START_TIMEOUT_S: Final = 60.0
"""Wait for the first inventory: starting a worker process on a busy node takes seconds."""
RETRY_S: Final = 5.0
"""Least time between two attempts to recreate a node's dead actor."""


def _why(exc: BaseException) -> str:
    """One line from a Ray error: its first line and, when different, its last (the cause)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(dict.fromkeys(lines[:1] + lines[-1:]))
    return f"{type(exc).__name__}: {text}"[:300]


class NodeTelemetryActor:
    """Runs on one node (as a Ray actor) and reads that node's GPUs.

    Indices here are node-local; `RayTelemetry` renumbers them. Everything it returns is a
    frozen dataclass of plain values, so it pickles across Ray unchanged.
    """

    def __init__(self, node: str, model: str, gpu_count: int) -> None:
        self._node = node
        self._tele: Telemetry
        try:
            self._tele = NvmlTelemetry()
            self._source = "nvml"
        except NoGpuError:
            if gpu_count < 1:
                raise SpecError(
                    f"node {node}: NVML sees no GPU and the node declares none; declare its "
                    "GPUs with node_resources(name, model, gpus)"
                ) from None
            inlet = parse_inlet(os.environ.get(FAKE_INLET_ENV, ""))
            self._tele = FakeTelemetry(f"{gpu_count}x{model}", inlet_c=inlet)
            self._source = "fake"

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def source(self) -> str:
        return self._source

    def inventory(self) -> list[GpuInfo]:
        return self._tele.inventory()

    def sample(self, now_s: float) -> list[GpuSample]:
        return self._tele.sample(now_s)

    def apply(self, command: SetPowerCap) -> ApplyResult:
        return self._tele.apply(command)

    def set_load(self, index: int, util_pct: float, mem_used_mib: int) -> None:
        """What runs on a fake GPU; real GPUs show their load by themselves (no-op)."""
        if isinstance(self._tele, FakeTelemetry):
            self._tele.set_load(index, util_pct, mem_used_mib)

    def fail_gpu(self, index: int, problem: str) -> None:
        """Inject a fault into a fake GPU (tests); a real GPU cannot be made to fail."""
        self.inject(index, "lost", problem=problem)

    def inject(
        self, index: int, fault: str, xid: int | None = None, count: int = 1, problem: str = ""
    ) -> str:
        """One of the fake fleet's faults (FakeTelemetry.inject) on local GPU `index`; a
        node with real GPUs refuses (the answer says why)."""
        if not isinstance(self._tele, FakeTelemetry):
            return f"refused: node {self._node} has real GPUs (NVML); faults cannot be injected"
        return self._tele.inject(index, fault, xid=xid, count=count, problem=problem)

    def close(self) -> None:
        self._tele.close()


@dataclass
class _Node:
    name: str
    model: str
    count: int
    offset: int
    ray_node_id: str
    actor: Any = None
    created: bool = False
    source: str = "unknown"
    pending: Any = None
    """The sample call still in flight: no second one is sent while it is."""
    loads: dict[int, tuple[float, int]] = field(default_factory=dict)
    """Loads set since the last sample, by local GPU index, not yet sent."""
    misses: MissCounter = field(default_factory=MissCounter)
    """Its missed answers in a row and its last answer, which stands in until the limit."""
    problem: str = ""
    """Why the actor is unusable now ("" while it answers)."""
    next_retry: float = 0.0


class RayTelemetry(Telemetry):
    """The `Telemetry` of a fleet of Ray nodes, one `NodeTelemetryActor` each.

    `fleet` is (name, model, gpu_count) per node in fleet order; `nodes` maps names to Ray
    node ids (missing names are looked up with `ray_nodes()`). The declared counts fix the
    global numbering, so it never shifts when a node is down: a node whose NVML sees fewer
    GPUs reports the rest as missing, extra GPUs are not shown. A node's GPUs read as lost
    once it has missed `miss_limit` answers in a row; before that its last answer stands in.
    """

    def __init__(
        self,
        fleet: Sequence[tuple[str, str, int]],
        nodes: Mapping[str, str] | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        sample_timeout_s: float = SAMPLE_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        retry_s: float = RETRY_S,
        miss_limit: int = DEFAULT_MISS_LIMIT,
    ) -> None:
        import ray

        if miss_limit < 1:
            raise SpecError(f"{KEY} must be at least 1, got {miss_limit}")
        self._ray: Any = ray  # actor handles are dynamic: typed loosely on purpose
        self._cls: Any = ray.remote(NodeTelemetryActor)
        self._namespace = namespace
        self._timeout = sample_timeout_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._closed = False
        ids = dict(nodes or {})
        if any(name not in ids for name, _, _ in fleet):
            ids.update({n.name: n.ray_node_id for n in ray_nodes() if n.name not in ids})
        self._nodes: list[_Node] = []
        offset = 0
        for name, model, count in fleet:
            # a node not in the cluster yet (a cloud node before its burst) reads
            # unhealthy until it joins; its actor is started then
            node = _Node(name, model, count, offset, ids.get(name, ""))
            node.misses = MissCounter(miss_limit)
            if not node.ray_node_id:
                node.problem = "its Ray node is not in the cluster"
            self._nodes.append(node)
            offset += count
        self._inventory: list[GpuInfo] = [
            info for node in self._nodes for info in self._declared(node)
        ]
        for node in self._nodes:
            if node.ray_node_id:
                self._start(node)
        refs = {node.name: node.actor.inventory.remote() for node in self._nodes if node.actor}
        deadline = time.monotonic() + start_timeout_s
        for node in self._nodes:
            if node.name in refs:
                self._learn(node, refs[node.name], max(deadline - time.monotonic(), 0.01))

    # ---- actors

    def _start(self, node: _Node) -> None:
        """Find or create the node's actor (asynchronously: it answers when it is up)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = ACTOR_PREFIX + node.name
        try:
            node.actor = self._ray.get_actor(name, namespace=self._namespace)
            return
        except ValueError:
            pass
        try:
            node.actor = self._cls.options(
                name=name,
                namespace=self._namespace,
                get_if_exists=True,
                num_cpus=0,
                num_gpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.ray_node_id, soft=False),
                max_concurrency=4,
                max_restarts=0,
            ).remote(node.name, node.model, node.count)
            node.created = True
        except Exception as exc:  # the GCS refused: the node reads unhealthy until retried
            node.actor = None
            node.problem = f"cannot start its telemetry actor ({_why(exc)})"

    def _learn(self, node: _Node, inventory_ref: Any, timeout_s: float) -> None:
        """Take the node's real inventory and source once its actor answers."""
        try:
            local, source = self._ray.get(
                [inventory_ref, node.actor.source.remote()], timeout=timeout_s
            )
        except Exception as exc:
            node.problem = f"telemetry actor unreachable ({_why(exc)})"
            return
        node.source, node.problem = source, ""
        infos = self._declared(node)
        for info in local[: node.count]:
            uuid = f"FAKE-GPU-{node.offset + info.index}" if source == "fake" else info.uuid
            infos[info.index] = dataclasses.replace(info, index=node.offset + info.index, uuid=uuid)
        with self._lock:
            self._inventory[node.offset : node.offset + node.count] = infos

    def _declared(self, node: _Node) -> list[GpuInfo]:
        """The declared GPUs, until the node says what it has (the catalogue's figures)."""
        try:
            declared = parse_fleet(f"{node.count}x{node.model}") if node.count else []
        except SpecError:
            declared = [GpuInfo(i, "", node.model, 0, None, None) for i in range(node.count)]
        return [
            dataclasses.replace(
                info, index=node.offset + info.index, uuid=f"{node.name}-GPU-{info.index}"
            )
            for info in declared
        ]

    def _recover(self, node: _Node) -> None:
        """Recreate a dead actor, at most every retry_s, on the node's current Ray id."""
        now = time.monotonic()
        if now < node.next_retry:
            return
        node.next_retry = now + self._retry_s
        alive = {n.name: n.ray_node_id for n in ray_nodes()}
        if node.name not in alive:
            node.problem = "its Ray node is not in the cluster"
            node.actor = None
            return
        node.ray_node_id = alive[node.name]
        node.pending = None
        self._start(node)  # its first answer to sample() refreshes the inventory
        if node.actor is not None:
            node.problem = "telemetry actor restarting after it died"

    # ---- the Telemetry protocol

    def inventory(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._inventory)

    def sources(self) -> dict[str, str]:
        """Node name -> "nvml" or "fake" ("unknown" until its actor has answered)."""
        return {node.name: node.source for node in self._nodes}

    def sample(self, now_s: float) -> list[GpuSample]:
        """One reading of every GPU, all nodes asked at once, waiting sample_timeout_s in all.

        A node that does not answer has missed one: its last answer stands in (stamped
        now_s) until it has missed miss_limit in a row, then its GPUs read unhealthy with the
        reason; one answer starts the count over. A node still busy
        with an earlier call is not asked again (calls never pile up on a stuck actor); that
        call's reading is used when it lands, with the at_s it was asked at. A dead actor is
        recreated (at most every retry_s) while its Ray node is alive.
        """
        from ray.exceptions import RayActorError

        if self._closed:
            raise ConflictError("telemetry is closed; start a new RayTelemetry to read GPUs")
        self._flush_loads()
        for node in self._nodes:
            if node.actor is None or node.problem.startswith("telemetry actor died"):
                self._recover(node)
            if node.actor is not None and node.pending is None:
                node.pending = node.actor.sample.remote(now_s)
        refs = [node.pending for node in self._nodes if node.pending is not None]
        if refs:
            self._ray.wait(refs, num_returns=len(refs), timeout=self._timeout)
        out: list[GpuSample] = []
        for node in self._nodes:
            local: list[GpuSample] | None = None
            if node.pending is not None:
                ready, _ = self._ray.wait([node.pending], timeout=0)
                if not ready:
                    node.problem = (
                        f"telemetry actor unreachable (no answer within {self._timeout:g} s)"
                    )
                else:
                    ref, node.pending = node.pending, None
                    try:
                        local = self._ray.get(ref)
                        if node.problem:
                            self._learn(node, node.actor.inventory.remote(), self._timeout)
                    except RayActorError as exc:
                        node.problem = f"telemetry actor died ({_why(exc)})"
                    except Exception as exc:
                        node.problem = f"telemetry failed ({_why(exc)})"
            kept = node.misses.answered(local) if local is not None else None
            if kept is None:  # no answer this round: the last one while under the limit
                kept = node.misses.missed(now_s)
            out.extend(self._node_samples(node, kept, now_s))
        return out

    def _node_samples(
        self, node: _Node, local: list[GpuSample] | None, now_s: float
    ) -> list[GpuSample]:
        infos = self.inventory()[node.offset : node.offset + node.count]
        if local is None:
            missed = node.misses.misses
            row = f", {missed} answers missed in a row ({KEY} {node.misses.limit})"
            problem = (
                f"node {node.name}: {node.problem or 'telemetry actor unreachable'}"
                f"{row if missed > 1 else ''}; its GPUs cannot be read, so it is drained "
                "until the actor answers again"
            )
            return [lost_sample(info, problem, now_s) for info in infos]
        got = {s.index: s for s in local}
        out: list[GpuSample] = []
        for i, info in enumerate(infos):
            s = got.get(i)
            if s is None:
                problem = (
                    f"node {node.name}: GPU {i} is declared but NVML does not see it; "
                    "check the node with nvidia-smi"
                )
                out.append(lost_sample(info, problem, now_s))
                continue
            problem = f"node {node.name}: {s.problem}" if s.problem else ""
            out.append(dataclasses.replace(s, index=info.index, uuid=info.uuid, problem=problem))
        return out

    def _locate(self, index: int) -> tuple[_Node, int]:
        for node in self._nodes:
            if node.offset <= index < node.offset + node.count:
                return node, index - node.offset
        total = sum(n.count for n in self._nodes)
        raise NotFoundError(f"the fleet has no GPU {index}; its GPUs are 0-{total - 1}")

    def _call(self, node: _Node, method: str, *args: object) -> Any:
        if node.actor is None:
            raise ConflictError(f"node {node.name}: {node.problem or 'no telemetry actor'}")
        return self._ray.get(getattr(node.actor, method).remote(*args), timeout=self._timeout)

    def apply(self, command: SetPowerCap) -> ApplyResult:
        """Send the command to the node that owns GPU `command.gpu` (a global index)."""
        try:
            node, local = self._locate(command.gpu)
        except NotFoundError as exc:
            return ApplyResult(False, str(exc))
        try:
            result: ApplyResult = self._call(node, "apply", dataclasses.replace(command, gpu=local))
        except Exception as exc:
            return ApplyResult(False, f"node {node.name}: nothing applied ({_why(exc)})")
        return ApplyResult(result.ok, f"node {node.name}: {result.message}")

    def set_load(self, index: int, util_pct: float, mem_used_mib: int) -> None:
        """What runs on global GPU `index` (fake nodes only). Kept here and sent to the
        node before its next sample, all of a node's at once (the last per GPU wins): a
        cycle that starts many jobs makes no Ray round trip per GPU. An unreachable node
        is skipped, its samples already say it is unhealthy."""
        node, local = self._locate(index)
        if node.source == "nvml":
            return  # real GPUs show their load by themselves
        node.loads[local] = (util_pct, mem_used_mib)

    def _flush_loads(self) -> None:
        """Send every node's queued loads and wait for them (within the call timeout), so
        that what is read next reflects them."""
        refs = []
        for node in self._nodes:
            loads, node.loads = node.loads, {}
            if node.actor is None:
                continue
            for local, (util, mem) in loads.items():
                with contextlib.suppress(Exception):
                    refs.append(node.actor.set_load.remote(local, util, mem))
        if refs:
            with contextlib.suppress(Exception):
                self._ray.wait(refs, num_returns=len(refs), timeout=self._timeout)

    def fail_gpu(self, index: int, problem: str = "fell off the bus (injected fault)") -> None:
        """Inject a fault into global GPU `index` of a fake node (tests)."""
        self.inject(index, "lost", problem=problem)

    def inject(
        self, index: int, fault: str, *, xid: int | None = None, count: int = 1, problem: str = ""
    ) -> str:
        """A fake fault on (or the repair of) global GPU `index`, on its node's telemetry
        actor (the admin's POST /v1/admin/fake-faults); a node with real GPUs refuses."""
        self._flush_loads()
        node, local = self._locate(index)
        done: str = self._call(node, "inject", local, fault, xid, count, problem)
        if done.startswith("refused: "):
            raise ConflictError(done[len("refused: ") :])
        return done

    def actor(self, node: str) -> Any:
        """The node's actor handle (tests and diagnostics), the loads set so far sent."""
        self._flush_loads()
        return next(n.actor for n in self._nodes if n.name == node)

    def close(self) -> None:
        """Kill the actors this object created; ones it found already running stay."""
        self._closed = True
        for node in self._nodes:
            if node.created and node.actor is not None:
                with contextlib.suppress(Exception):
                    self._ray.kill(node.actor)
            node.actor, node.pending = None, None
