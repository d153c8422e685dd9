"""Run jobs on the nodes of a Ray cluster, on exactly the node and GPU indices the core chose.

Each node has one warm launcher (:class:`~gpupool.server.executors.ray_launcher.NodeLauncher`, a
detached actor pinned to the node by hard affinity, restarted by Ray when it dies), with
``num_gpus=0`` and ``num_cpus=0`` so that Ray's own GPU accounting can neither remap
``CUDA_VISIBLE_DEVICES`` nor queue jobs behind a CPU. A launch is one call to it: it
starts the job under the same shim as :class:`LocalExecutor` (own session and process
group, exit record in the run directory), claims the job's GPU indices on the node (two
jobs never hold one index), and later answers cheap calls that carry the shim's pid and
start ticks: ``poll_many``, ``signal``, ``read_log``, ``find``, ``release``. A gang wider
than one node is one start per member, on each member's node's launcher, all or none.

Preemption keeps the checkpoint protocol: SIGTERM to the job's process group through the
launcher, then SIGKILL once the grace period (kept in the caller's clock) has passed, sent
by the first poll after the deadline. A node that Ray no longer lists as alive makes poll
report its attempts as outcome "lost"; a launcher that dies only is replaced, and its jobs
run on. See docs/ray.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.ports.executor.base import (
    LOST,
    SUCCEEDED,
    Exit,
    Handle,
    LaunchSpec,
    validate,
)
from gpupool.ports.executor.stops import ask_stop, watched
from gpupool.server.executors.files import (
    STDOUT_LOG,
    exit_file,
    launch_file,
    read_json,
    write_atomically,
)
from gpupool.server.executors.ray_launcher import (
    AgentSettings,
    NodeLauncher,
    ShimStart,
    launcher_name,
    member_dir,
    member_key,
    state_root,
)
from gpupool.server.executors.ray_logs import RunLogs, offsets
from gpupool.server.executors.ray_nodes import ray_nodes
from gpupool.server.executors.ray_runs import (
    VANISHED,
    RayJob,
    RayRun,
    gang_env,
    gang_exit,
    gang_file,
    judge,
    member_exit,
    read_gang,
    streamed_file,
    streams,
)

if TYPE_CHECKING:
    from gpupool.ports.executor.base import Executor

DEFAULT_NAMESPACE = "gpupool"
CALL_TIMEOUT_S = 5.0  # a live launcher answers in milliseconds; longer: its node is in doubt


class RayExecutor:
    """The Executor protocol on a Ray cluster the caller has already joined (ray.init).

    `nodes` maps gpupool node names to Ray node ids; when omitted (or a name is missing)
    it is filled from :func:`ray_nodes`. `launch` runs on `default_node`; use
    :meth:`launch_on` to name the node per attempt. The launchers are detached and named
    per node in `namespace`, so jobs outlive the scheduler and `adopt` finds them again
    through them. `python` must exist at the same path on every node. `agent`: how each
    node's agent contains jobs (cgroups, log cap); a LaunchSpec's user is each job's
    team user, which every node must agree on (same name, uid and gid)."""

    def __init__(
        self,
        nodes: Mapping[str, str] | None = None,
        *,
        default_node: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        python: str = sys.executable,
        call_timeout_s: float = CALL_TIMEOUT_S,
        agent: AgentSettings | None = None,
        isolation: Any = None,
    ) -> None:
        import ray

        self._ray: Any = ray  # actor handles are dynamic: typed loosely on purpose
        self._nodes: dict[str, str] = dict(nodes or {})
        self._default_node = default_node
        self._namespace = namespace
        self._python = python
        self._timeout = call_timeout_s
        self._agent = agent or AgentSettings()
        self._logs = RunLogs(ray, call_timeout_s)
        self._fence = (f"gpupool-scheduler:{namespace}", secrets.token_hex(8))
        """This scheduler's token in the cluster: the newest one's stands, and a node's
        launcher refuses starts from any other (one that died with a start in flight)."""
        self._fenced = False
        if ray.is_initialized():
            self._claim_fence()
        self.isolation = isolation
        """The policy that gives each job its team user and limits (read by the loop when
        it builds a LaunchSpec), as for LocalExecutor; None: jobs run as Ray's user."""
        self._launcher_cls: Any = ray.remote(NodeLauncher)
        self._launchers: dict[str, tuple[str, Any]] = {}
        """gpupool node -> (Ray node id, its warm launcher's handle)."""
        self._state_dir = str(state_root(namespace))
        self._jobs: dict[str, RayJob] = {}
        self._dead: list[Exit] = []
        """Ends found outside poll (a gang adopted only in part), reported by the next."""
        self._unresolved: dict[str, tuple[Handle, Path]] = {}
        """Attempts an adoption could not settle (a live node did not answer)."""
        self._addresses: dict[str, tuple[str, str]] = {}
        """gpupool node -> (Ray node id, its NodeManagerAddress), as last looked up."""
        for node in list(self._nodes):  # warm: each node's launcher starts now, not at launch
            self._launcher(node)

    def _claim_fence(self) -> None:
        """Make this scheduler the cluster's newest (at start, else before its first
        launch): from now on the nodes refuse starts sent by an older one."""
        if self._fenced:
            return
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(self._fence[0], self._fence[1], overwrite=True)
        self._fenced = True

    # ---- placement

    def remember_node(self, node: str, ray_node_id: str) -> None:
        """The node (re)joined with this Ray node id: launch there from now on."""
        self._nodes[node] = ray_node_id

    def node_id(self, node: str) -> str:
        if node not in self._nodes:
            self._nodes.update({n.name: n.ray_node_id for n in ray_nodes()})
        if node not in self._nodes:
            raise SpecError(f"node {node} is not in the Ray cluster (no live gpupool_node_{node})")
        return self._nodes[node]

    def node_address(self, node: str) -> str:
        """The node's address (Ray's NodeManagerAddress), looked up again when the node
        rejoined under another Ray node id."""
        ray_node = self.node_id(node)
        known = self._addresses.get(node)
        if known is None or known[0] != ray_node:
            found = {n.ray_node_id: n.address for n in ray_nodes()}
            if not found.get(ray_node):
                raise SpecError(f"node {node} has no address in the Ray cluster (not alive)")
            known = (ray_node, found[ray_node])
            self._addresses[node] = known
        return known[1]

    # ---- the warm launchers

    def _launcher(self, node: str) -> Any:
        """The node's launcher, created (or found, after a scheduler restart) on first use:
        detached, pinned to the node by hard affinity, restarted by Ray when it dies."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray_node = self.node_id(node)
        known = self._launchers.get(node)
        if known is not None and known[0] == ray_node:
            return known[1]
        handle = self._launcher_cls.options(
            name=launcher_name(node, ray_node),
            namespace=self._namespace,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            num_gpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False),
            max_concurrency=16,
            max_restarts=-1,
            max_task_retries=0,
        ).remote(node, self._state_dir, self._agent)
        self._launchers[node] = (ray_node, handle)
        return handle

    def launcher_info(self, node: str) -> dict[str, Any]:
        """The node's launcher: its pid, its node and the raylet its jobs are fenced on."""
        info: dict[str, Any] = self._ray.get(
            self._launcher(node).info.remote(), timeout=self.START_TIMEOUT_S
        )
        return info

    def agent_status(self, alive: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """Each node's agent as it answers now (NodeLauncher.status: leaving, storage,
        where its records are, how it contains jobs): one cheap call to each node's
        launcher, all in flight at once; a node that does not answer in time is left
        out (and asked again next time). `alive`: the nodes the cluster lists now (name
        -> Ray node id), asked too though no job has run there yet."""
        if alive is not None:  # only the listed nodes: a dead one's launcher never answers
            for name, ray_node in alive.items():
                self.remember_node(name, ray_node)
        asks = {}
        for node in list(alive if alive is not None else self._nodes):
            with contextlib.suppress(Exception):
                asks[node] = self._launcher(node).status.remote()
        out: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + self._timeout
        for node, ref in asks.items():
            with contextlib.suppress(Exception):
                out[node] = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
        return out

    def _node_alive(self, node: str) -> bool:
        """Whether Ray still lists the node's Ray node as alive (a GCS call)."""
        ray_node = self._nodes.get(node)
        ray_api: Any = self._ray
        for entry in ray_api.nodes():
            if str(entry.get("NodeID")) == ray_node:
                return bool(entry.get("Alive"))
        return False

    # ---- starting

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        if self._default_node is None:
            raise SpecError(
                f"job {spec.job_id}: RayExecutor has no default node; use launch_on(spec, node)"
            )
        return self.launch_on(spec, self._default_node, now_s)

    def launch_on(self, spec: LaunchSpec, node: str, now_s: float) -> Handle:
        """Start the attempt on gpupool node `node`, on GPUs `spec.gpu_indices` of it."""
        (result,) = self.launch_many([(spec, node)], now_s)
        if isinstance(result, GpupoolError):
            raise result
        return result

    START_TIMEOUT_S = 60.0
    runs_gangs = True
    """A job placed over several nodes runs here as a gang: one member per node."""

    def _run_of(
        self, answer: Mapping[str, Any], launch: ShimStart, node: str, launcher: Any
    ) -> RayRun:
        spec = launch.spec
        log_dir = spec.run_dir / member_dir(launch.rank) if launch.rank else spec.run_dir
        run = RayRun(
            member_key(spec.job_id, launch.rank),
            launch.rank,
            node,
            launcher,
            int(answer["pid"]),
            int(answer["ticks"]),
            str(answer.get("record") or exit_file(log_dir, spec.attempt)),
            log_dir,
            node_log_dir=str(answer.get("log_dir") or ""),
            streamed=offsets(answer.get("log_offsets")),
        )
        if streams(run):
            self._logs.save(run, spec.attempt)
        return run

    def _adopted_run(
        self, key: str, rank: int, node: str, found: Mapping[str, Any], log_dir: Path, attempt: int
    ) -> RayRun:
        """A run an earlier scheduler started, from its node's record; what of its logs
        was already copied from the scheduler's own note of it."""
        run = RayRun(
            key,
            rank,
            node,
            self._launcher(node),
            int(found["pid"]),
            int(found["ticks"]),
            str(found["record"]),
            log_dir,
            node_log_dir=str(found.get("log_dir") or ""),
        )
        if streams(run):
            saved = read_json(streamed_file(run, attempt))
            run.streamed = offsets(saved if saved is not None else found.get("log_offsets"))
        return run

    def launch_many(
        self, launches: Sequence[tuple[LaunchSpec, str]], now_s: float
    ) -> list[Handle | GpupoolError]:
        """Start several attempts at once: one call to each node's warm launcher carries
        all of that node's launches, and every call is in flight before any is waited
        for. One result per launch, in order: its handle, or the error that stopped it."""
        self._claim_fence()
        results: list[Handle | GpupoolError | None] = [None] * len(launches)
        gangs: list[tuple[int, LaunchSpec]] = []
        by_node: dict[str, list[tuple[int, ShimStart]]] = {}
        for k, (spec, node) in enumerate(launches):
            if spec.gang is not None and len(spec.gang.members) > 1:
                gangs.append((k, spec))  # started below, once the single-node launches are out
                continue
            try:
                validate(spec)
                if spec.job_id in self._jobs or any(
                    spec.job_id == other.spec.job_id for _, other in by_node.get(node, [])
                ):
                    raise ConflictError(
                        f"job {spec.job_id} is already watched here; poll until it ends "
                        "before launching it again"
                    )
                self.node_id(node)
            except GpupoolError as err:
                results[k] = err
                continue
            spec = dataclasses.replace(
                spec,
                env=dict(spec.env),
                run_dir=spec.run_dir.absolute(),
                launch_token=secrets.token_hex(16),
            )
            try:
                self._record_intent(spec)
            except OSError as err:
                results[k] = Unavailable(
                    f"job {spec.job_id}: cannot record its launch intent in {spec.run_dir}: "
                    f"{err}; it is requeued"
                )
                continue
            by_node.setdefault(node, []).append((k, ShimStart(spec, self._python)))
        calls = []
        for node, items in by_node.items():
            launcher = self._launcher(node)
            ref = launcher.start_many.remote([launch for _, launch in items], self._fence)
            calls.append((node, items, launcher, ref))
        deadline = time.monotonic() + self.START_TIMEOUT_S
        for node, items, launcher, ref in calls:
            try:
                answers = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except Exception as e:
                # Should the launcher still start one, the requeued job's next attempt
                # kills it first (the launcher's records): a job never runs twice.
                for k, launch in items:
                    results[k] = Unavailable(
                        f"job {launch.spec.job_id}: node {node}'s launcher did not answer "
                        f"within {self.START_TIMEOUT_S:.0f} s ({type(e).__name__}); it is "
                        "requeued"
                    )
                continue
            for (k, launch), answer in zip(items, answers, strict=True):
                spec = launch.spec
                if "error" in answer:
                    kind = ConflictError if answer.get("conflict") else SpecError
                    results[k] = kind(f"job {spec.job_id}: {answer['error']}")
                    continue
                run = self._run_of(answer, launch, node, launcher)
                handle = Handle(spec.job_id, spec.attempt, run.pid, run.pid, run.ticks)
                self._jobs[spec.job_id] = RayJob(handle, [run], run_dir=spec.run_dir)
                results[k] = handle
        for k, spec in gangs:
            results[k] = self._launch_gang(spec)
        out: list[Handle | GpupoolError] = []
        for r in results:
            assert r is not None
            out.append(r)
        return out

    @staticmethod
    def _record_intent(spec: LaunchSpec) -> None:
        """The launch intent, in the server's run directory, before any node is asked to
        start the attempt: a server that dies before it learns the pid finds the attempt
        again by its token on whichever node started it (adopt), never a second copy."""
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        intent = {"job_id": spec.job_id, "attempt": spec.attempt, "token": spec.launch_token}
        write_atomically(launch_file(spec.run_dir, spec.attempt), {**intent, "cgroup": ""})

    def _launch_gang(self, spec: LaunchSpec) -> Handle | GpupoolError:
        """All members or none: rank 0's launcher finds the rendezvous port, then every
        member's launcher starts its member; if any cannot, those started are killed and
        the job is requeued."""
        gang = spec.gang
        assert gang is not None
        members = gang.members
        try:
            validate(spec)
            if spec.job_id in self._jobs:
                raise ConflictError(
                    f"job {spec.job_id} is already watched here; poll until it ends before "
                    "launching it again"
                )
            launchers = [self._launcher(m.node) for m in members]
        except GpupoolError as err:
            return err
        run_dir = spec.run_dir.absolute()
        spec = dataclasses.replace(spec, env=dict(spec.env), run_dir=run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        layout = [
            {"rank": k, "node": m.node, "gpus": list(m.gpu_indices)} for k, m in enumerate(members)
        ]
        gang_file(run_dir, spec.attempt).write_text(
            json.dumps({"members": layout}), encoding="utf-8"
        )
        where = ", ".join(f"{m.node}:{','.join(map(str, m.gpu_indices))}" for m in members)
        deadline = time.monotonic() + self.START_TIMEOUT_S
        runs: list[RayRun] = []
        why = ""
        try:
            addr, port = self._ray.get(launchers[0].endpoint.remote(), timeout=self.START_TIMEOUT_S)
            launches = []
            for rank, m in enumerate(members):
                env = dict(spec.env)
                if "GPUPOOL_FAKE_GPUS" in env:  # a fake fleet: this member's fake GPUs
                    env["GPUPOOL_FAKE_GPUS"] = ",".join(str(i) for i in m.gpu_indices)
                mspec = dataclasses.replace(spec, env=env, gpu_indices=m.gpu_indices, gang=None)
                launches.append(
                    ShimStart(mspec, self._python, rank, gang_env(members, rank, addr, port))
                )
            refs = [
                launcher.start_many.remote([launch], self._fence)
                for launcher, launch in zip(launchers, launches, strict=True)
            ]
            for rank, ref in enumerate(refs):
                try:
                    (answer,) = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
                except Exception as err:
                    why = why or f"rank {rank} on node {members[rank].node}: {type(err).__name__}"
                    continue
                if "error" in answer:
                    why = why or f"rank {rank}: {answer['error']}"
                    continue
                runs.append(
                    self._run_of(answer, launches[rank], members[rank].node, launchers[rank])
                )
        except Exception as err:
            why = why or f"{type(err).__name__}: {err}"
        if why or len(runs) != len(members):
            self._kill_runs(runs)
            return Unavailable(
                f"job {spec.job_id}: not every member of its gang of {len(members)} nodes "
                f"({where}) started within {self.START_TIMEOUT_S:.0f} s ({why}); the "
                "members that did were killed, none runs, it is requeued"
            )
        handle = Handle(spec.job_id, spec.attempt, runs[0].pid, runs[0].pid, runs[0].ticks)
        self._jobs[spec.job_id] = RayJob(handle, runs, grace_s=gang.grace_s, run_dir=run_dir)
        return handle

    def _kill_runs(self, runs: Sequence[RayRun]) -> None:
        """SIGKILL each run's process group through its launcher, then release it."""
        refs = []
        for run in runs:
            with contextlib.suppress(Exception):
                refs.append(run.launcher.signal.remote(run.pid, run.ticks, signal.SIGKILL, run.key))
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.get(ref, timeout=self._timeout)
        for run in runs:
            self._release(run)

    def _release(self, run: RayRun) -> None:
        with contextlib.suppress(Exception):
            run.launcher.release.remote(run.key, run.pid)

    # ---- adoption

    def _find(self, node: str, key: str) -> dict[str, Any] | None:
        try:
            entry: dict[str, Any] | None = self._ray.get(
                self._launcher(node).find.remote(key), timeout=self.START_TIMEOUT_S
            )
        except Exception:
            return None
        return entry

    def _adopt_gang(self, handle: Handle, run_dir: Path, layout: list[Any]) -> bool:
        """A gang is adopted whole or not at all: if any member is gone after the restart,
        the live ones are killed and the next poll reports the job lost (requeued)."""
        runs: list[RayRun] = []
        missing: list[str] = []
        for k, entry in enumerate(layout):
            node = str(entry.get("node", "?")) if isinstance(entry, dict) else "?"
            found = self._find(node, member_key(handle.job_id, k)) if node != "?" else None
            if found is None or int(found.get("attempt", 0)) != handle.attempt:
                missing.append(f"rank {k} on node {node}")
                continue
            log_dir = run_dir / member_dir(k) if k else run_dir
            run = self._adopted_run(
                member_key(handle.job_id, k), k, node, found, log_dir, handle.attempt
            )
            runs.append(run)
            if not found.get("running") or (
                k == 0 and (run.pid, run.ticks) != (handle.pid, handle.start_ticks)
            ):
                missing.append(f"rank {k} on node {node}")
        if not missing and len(runs) == len(layout):
            self._jobs[handle.job_id] = RayJob(handle, runs, run_dir=run_dir)
            return True
        self._kill_runs(runs)
        lost_node = missing[0].rsplit(" ", 1)[-1] if missing else None
        self._dead.append(
            Exit(
                handle.job_id,
                handle.attempt,
                LOST,
                None,
                None,
                f"after the scheduler restarted, gang member {', '.join(missing)} was gone; "
                "the other members were killed (never half a gang): requeue the job, it "
                "resumes from its last checkpoint",
                0.0,
                node=lost_node,
            )
        )
        return False

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """Watch an attempt an earlier scheduler started: True if a node's launcher started
        that very process (pid and start time), or (a handle of pid 0, from the launch
        intent only) the attempt whose launch token the intent names; every reachable
        node is asked. Stop requests made before the restart are not remembered yet."""
        if handle.job_id in self._jobs:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
        run_dir = run_dir.absolute()
        layout = read_gang(gang_file(run_dir, handle.attempt))
        if layout is not None:
            return self._adopt_gang(handle, run_dir, layout)
        if not self._nodes:
            self._nodes.update({n.name: n.ray_node_id for n in ray_nodes()})
        found = self._search(handle, run_dir)
        if found is None:  # a live node did not answer: asked again at each poll
            self._unresolved[handle.job_id] = (handle, run_dir)
            return False
        return found

    def _search(self, handle: Handle, run_dir: Path) -> bool | None:
        """Ask every node's agent for the attempt: True once adopted; False when every
        node answered (or is dead) and none runs it, which the next poll reports as lost;
        None when a live node did not answer (it may run it: never requeue on a guess)."""
        asks = {}
        silent: list[str] = []
        for node in list(self._nodes):
            try:
                asks[node] = self._launcher(node).find.remote(handle.job_id)
            except Exception:
                silent.append(node)
        deadline = time.monotonic() + self.START_TIMEOUT_S
        for node, ref in asks.items():
            try:
                entry = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except Exception:
                silent.append(node)
                continue
            if entry is None:
                continue
            if handle.pid <= 0:
                # the server died between the start and recording the pid: the launch
                # intent's token names the attempt that node started (never a second one)
                if not handle.token or entry.get("token") != handle.token:
                    continue
                if int(entry.get("attempt", 0)) != handle.attempt:
                    continue
                pid, ticks = int(entry["pid"]), int(entry["ticks"])
                handle = dataclasses.replace(handle, pid=pid, pgid=pid, start_ticks=ticks)
            if (int(entry["pid"]), int(entry["ticks"])) != (handle.pid, handle.start_ticks):
                continue
            run = self._adopted_run(handle.job_id, 0, node, entry, run_dir, handle.attempt)
            self._jobs[handle.job_id] = RayJob(handle, [run], run_dir=run_dir)
            return True
        if any(self._node_alive(node) for node in silent):
            return None
        self._dead.append(
            Exit(
                handle.job_id,
                handle.attempt,
                LOST,
                None,
                None,
                f"after the scheduler restarted, no node runs attempt {handle.attempt} (its "
                "start never reached a node, or its node is gone): requeue the job, it "
                "resumes from its last checkpoint",
                0.0,
            )
        )
        return False

    # ---- stopping

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "preempt", grace_s, now_s)

    can_resize = True

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        """Its processes checkpoint and leave as for a preemption (the exit says
        "preempted"); the service relaunches it on its new GPUs, on whichever node, where
        its checkpoint (in the shared storage) is found."""
        self._stop(job_id, "preempt", grace_s, now_s)

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "cancel", grace_s, now_s)

    def _stop(self, job_id: str, kind: str, grace_s: float, now_s: float) -> None:
        job = watched(self._jobs, job_id)
        ask_stop(job, kind, grace_s, now_s)
        if job.sigterm_at_wall_s is None:
            job.sigterm_at_wall_s = time.time()
        self._send(job, signal.SIGTERM)
        self._enforce(job, now_s)

    def _send(self, job: RayJob, sig: int) -> None:
        # every run still going, all in flight at once; a dead node: poll says "lost"
        refs = []
        for run in job.runs:
            if not run.done:
                with contextlib.suppress(Exception):
                    refs.append(run.launcher.signal.remote(run.pid, run.ticks, sig, run.key))
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.get(ref, timeout=self._timeout)

    def _enforce(self, job: RayJob, now_s: float) -> None:
        if job.kill_sent or job.deadline_s is None or now_s < job.deadline_s:
            return
        self._send(job, signal.SIGKILL)
        job.kill_sent = True

    # ---- watching

    def poll(self, now_s: float) -> list[Exit]:
        """One call to each node's launcher for all of its runs, all in flight at once.
        A launcher that cannot answer within the call timeout is asked again next time
        (Ray replaces one that died); a node Ray no longer lists as alive makes its
        attempts "lost"."""
        for job_id, (handle, run_dir) in list(self._unresolved.items()):
            if self._search(handle, run_dir) is not None:
                del self._unresolved[job_id]
        exits: list[Exit] = [dataclasses.replace(e, at_s=now_s) for e in self._dead]
        self._dead.clear()
        if self._logs.due():
            running = [(r, j.handle.attempt) for j in self._jobs.values() for r in j.runs]
            self._logs.copy([(r, a) for r, a in running if not r.done])
        for job in self._jobs.values():
            self._enforce(job, now_s)
        by_node: dict[str, list[tuple[str, RayRun]]] = {}
        for job_id, job in self._jobs.items():
            for run in job.runs:
                if not run.done:
                    by_node.setdefault(run.node, []).append((job_id, run))
        refs = {
            node: items[0][1].launcher.poll_many.remote(
                [(run.key, run.pid, run.ticks, run.record) for _, run in items]
            )
            for node, items in by_node.items()
        }
        answers: dict[str, Any] = {}
        deadline = time.monotonic() + self._timeout
        for node, ref in refs.items():
            try:
                answers.update(self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01)))
            except Exception:
                # The launcher is being replaced (its jobs run on, fenced on the raylet)
                # or its node is gone: only the node's death makes its runs lost.
                if not self._node_alive(node):
                    for _, run in by_node[node]:
                        answers[run.key] = VANISHED
                    self._launchers.pop(node, None)
        for job_id in list(self._jobs):
            job = self._jobs[job_id]
            if job.gang:
                ended = self._poll_gang(job, answers, now_s)
                if ended is None:
                    continue
                exits.append(ended)
                for run in job.runs:
                    if not run.vanished:
                        self._collect_logs(job, run, run.result)
                self._forget(job_id)
                continue
            answer = answers.get(job_id)
            if answer is None:
                continue
            run = job.runs[0]
            if answer.get("node_lost"):
                exits.append(judge(job, None, now_s, vanished=True))
            else:
                exits.append(judge(job, answer, now_s, vanished=False))
                self._collect_logs(job, run, answer)
            self._forget(job_id)
        return exits

    def _poll_gang(self, job: RayJob, answers: Mapping[str, Any], now_s: float) -> Exit | None:
        """Note which members ended; the first to end badly (or vanish with its node)
        stops all the others (SIGTERM, SIGKILL after the grace period). The gang's Exit
        comes once every member has ended: no member is left running alone."""
        for run in job.runs:
            answer = answers.get(run.key)
            if run.done or answer is None:
                continue
            if answer.get("node_lost"):
                run.vanished = True
            else:
                run.result = answer
            run.done, job.ended, run.order = True, job.ended + 1, job.ended + 1
            bad = run.vanished or member_exit(job, run, now_s).outcome != SUCCEEDED
            if bad and job.stop_kind is None and job.gang_stop is None:
                job.gang_stop = f"gang member rank {run.rank} on node {run.node}"
                job.deadline_s = now_s + job.grace_s
                job.sigterm_at_wall_s = time.time()
                self._send(job, signal.SIGTERM)
        if not all(run.done for run in job.runs):
            return None
        return gang_exit(job, now_s)

    def _collect_logs(self, job: RayJob, run: RayRun, ended: Mapping[str, Any] | None) -> None:
        """Before the attempt is released: the rest of the run's logs from its node."""
        if job.run_dir is not None:
            self._logs.finish(run, job.handle.attempt, ended)

    def _forget(self, job_id: str) -> None:
        """The attempt's end has been seen: its launchers release its GPU claims (a dead
        node's go with the node)."""
        job = self._jobs.pop(job_id)
        for run in job.runs:
            self._release(run)

    def read_log(
        self, job_id: str, name: str = STDOUT_LOG, offset: int = 0, rank: int = 0
    ) -> bytes:
        """Log bytes of a running job (of gang member `rank`), read on its node by the
        node's launcher."""
        job = watched(self._jobs, job_id)
        if not 0 <= rank < len(job.runs):
            raise NotFoundError(
                f"job {job_id} has no gang member of rank {rank}; it runs "
                f"{len(job.runs)} member(s), ranks from 0"
            )
        run = job.runs[rank]
        if streams(run):  # the copy here, brought up to date: one offset for all attempts
            self._logs.copy([(run, job.handle.attempt)])
            try:
                with (run.log_dir / name).open("rb") as f:
                    f.seek(offset)
                    return f.read(1 << 20)
            except OSError:
                return b""
        data: bytes = self._ray.get(
            run.launcher.read_log.remote(str(run.log_dir), name, offset), timeout=self._timeout
        )
        return data

    def actor_node_id(self, job_id: str) -> str:
        """The Ray node id the job runs on, as its node's launcher reports it."""
        run = watched(self._jobs, job_id).runs[0]
        node: str = self._ray.get(run.launcher.node_id.remote(), timeout=self._timeout)
        return node

    def handles(self) -> dict[str, Handle]:
        return {job_id: j.handle for job_id, j in self._jobs.items()}

    def shutdown(self) -> None:
        """Stop watching; the detached launchers and their jobs keep running for adoption."""
        self._jobs.clear()


if TYPE_CHECKING:
    _RAY: Executor = RayExecutor()
