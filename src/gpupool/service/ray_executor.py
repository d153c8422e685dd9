"""Run jobs on the nodes of a Ray cluster, on exactly the node and GPU indices the core chose.

One Ray actor per attempt, pinned with ``NodeAffinitySchedulingStrategy(soft=False)`` to the
node the caller names and holding one custom resource per chosen GPU index
(``gpupool_<node>_gpu<i>``), with ``num_gpus=0`` and ``num_cpus=0`` so that Ray's own GPU
accounting can neither remap ``CUDA_VISIBLE_DEVICES`` nor queue jobs behind a CPU. The
actor starts the job under the same shim as :class:`LocalExecutor` (own session and process
group, exit record in the run directory) and answers cheap calls: ``pid``, ``signal``,
``poll``, ``node_id``, ``read_log``. It is a threaded actor, so a signal gets through while
another call runs.

Preemption keeps the checkpoint protocol: SIGTERM to the job's process group through the
actor, then SIGKILL once the grace period (kept in the caller's clock) has passed, sent by
the first poll after the deadline. An actor that died with its node makes poll report the
attempt as outcome "lost". See docs/ray.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.service.executor import (
    CHECKPOINT_DIR,
    DEFAULT_GRACE_S,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_PATH,
    HOME_DIR,
    LOST,
    STDERR_LOG,
    STDOUT_LOG,
    SUCCEEDED,
    Exit,
    GangMember,
    Handle,
    LaunchSpec,
    _validate,
    classify,
    exit_file,
    job_environment,
    read_start_ticks,
    stop_file,
)

if TYPE_CHECKING:
    from gpupool.service.executor import Executor

NODE_PREFIX = "gpupool_node_"
MODEL_PREFIX = "gpupool_model_"
SITE_PREFIX = "gpupool_site_"
ACTOR_PREFIX = "gpupool-job-"
DEFAULT_NAMESPACE = "gpupool"
CALL_TIMEOUT_S = 5.0  # a live actor answers in milliseconds; longer means its node is in doubt


def member_dir(rank: int) -> str:
    """Where gang member `rank` (> 0) keeps its logs and exit record in the job's run
    directory; rank 0's are the job's own (``stdout.log``: what `gpupool logs` prints)."""
    return f"rank-{rank}"


def actor_name(job_id: str, rank: int = 0) -> str:
    """The detached actor of a job (rank 0 of a gang) or of gang member `rank`."""
    return ACTOR_PREFIX + job_id + (f"-rank{rank}" if rank else "")


def gang_file(run_dir: Path, attempt: int) -> Path:
    """The members of a gang attempt (rank, node, GPUs), for adoption after a restart."""
    return run_dir / f"gang-{attempt}.json"


def _read_gang(path: Path) -> list[Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    members = data.get("members") if isinstance(data, dict) else None
    return members if isinstance(members, list) and len(members) > 1 else None


def gang_env(members: Sequence[GangMember], rank: int, addr: str, port: int) -> dict[str, str]:
    """torchrun's variables for member `rank` (one process per node): where rank 0
    listens, how many members there are, which one this is, how many GPUs it has."""
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(members)),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GROUP_RANK": str(rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(len(members[rank].gpu_indices)),
        "GPUPOOL_GANG_NODES": ",".join(m.node for m in members),
    }


def gpu_resource(node: str, index: int) -> str:
    """The custom resource that stands for GPU `index` of gpupool node `node`."""
    return f"gpupool_{node}_gpu{index}"


def node_resources(node: str, model: str, gpu_count: int, site: str = "") -> dict[str, float]:
    """What a Ray node must declare (``ray start --resources``) to join gpupool's pool;
    `site` names its cluster when the service places across several."""
    res = {f"{NODE_PREFIX}{node}": 1.0, f"{MODEL_PREFIX}{model}": 1.0}
    if site:
        res[f"{SITE_PREFIX}{site}"] = 1.0
    res.update({gpu_resource(node, i): 1.0 for i in range(gpu_count)})
    return res


@dataclass(frozen=True)
class RayNode:
    """One live Ray node that declared itself a gpupool node."""

    ray_node_id: str
    name: str
    model: str
    gpu_count: int
    site: str = ""


def ray_nodes() -> list[RayNode]:
    """The live nodes of the connected Ray cluster that declare ``gpupool_node_<name>``,
    with their GPU model (``gpupool_model_<model>``) and GPU count (``gpupool_<name>_gpu<i>``)."""
    import ray

    ray_api: Any = ray  # ray.nodes() is untyped
    found: list[RayNode] = []
    for entry in ray_api.nodes():
        if not entry.get("Alive"):
            continue
        res: Mapping[str, float] = entry.get("Resources") or {}
        names = [k[len(NODE_PREFIX) :] for k in res if k.startswith(NODE_PREFIX)]
        if len(names) != 1:
            continue
        name = names[0]
        models = sorted(k[len(MODEL_PREFIX) :] for k in res if k.startswith(MODEL_PREFIX))
        prefix = f"gpupool_{name}_gpu"
        count = sum(1 for k in res if k.startswith(prefix) and k[len(prefix) :].isdigit())
        sites = sorted(k[len(SITE_PREFIX) :] for k in res if k.startswith(SITE_PREFIX))
        found.append(
            RayNode(
                str(entry["NodeID"]),
                name,
                models[0] if models else "",
                count,
                sites[0] if sites else "",
            )
        )
    return sorted(found, key=lambda n: n.name)


# --------------------------------------------------------------------------- the actor


class JobActor:
    """Lives on the job's node for the job's life; wrapped with ray.remote by RayExecutor."""

    def __init__(self, spec: LaunchSpec, node: str, python: str, rank: int | None = None) -> None:
        """`rank`: a gang member (rank 0 included), which starts only when `start` brings
        the gang's rendezvous; its logs and exit record go to ``rank-<k>/`` for k > 0."""
        import ray

        self._node_id = str(ray.get_runtime_context().get_node_id())
        run_dir = spec.run_dir.absolute()
        (run_dir / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / HOME_DIR).mkdir(exist_ok=True)
        self._spec, self._node, self._python = spec, node, python
        self._log_dir = run_dir / member_dir(rank) if rank else run_dir
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._run_dir = run_dir
        self._record = exit_file(self._log_dir, spec.attempt)
        for stale in (self._record, stop_file(self._log_dir, spec.attempt)):
            stale.unlink(missing_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None
        self._ticks = 0
        if rank is None:
            self.start({})

    def endpoint(self) -> tuple[str, int]:
        """This node's address and a port free on it now: the gang's MASTER_ADDR and
        MASTER_PORT when this is rank 0's actor."""
        import ray

        ray_api: Any = ray
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return str(ray_api.util.get_node_ip_address()), port

    def start(self, extra_env: Mapping[str, str]) -> tuple[int, int]:
        """Start the job (once) with `extra_env` on top of its own; (pid, start ticks)."""
        if self._proc is not None:
            return self.pid()
        spec = self._spec
        env = job_environment(spec)
        env.update(extra_env)
        env["GPUPOOL_NODE"] = self._node
        env["GPUPOOL_RAY_NODE_ID"] = self._node_id
        stdout, stderr = self._log_dir / STDOUT_LOG, self._log_dir / STDERR_LOG
        # The shim gets the job over a pipe, as under LocalExecutor: its own interpreter
        # runs isolated (-I) in a clean environment, the job's applies to the job only.
        job = {
            "argv": list(spec.argv),
            "env": env,
            "cwd": str(spec.cwd) if spec.cwd is not None else None,
            "stdout": str(stdout),
            "stderr": str(stderr),
            "log_max_bytes": DEFAULT_LOG_MAX_BYTES,
            "fence_ppid": os.getpid(),  # the job dies with this actor's node
        }
        read_end, write_end = os.pipe()
        argv = [self._python, "-I", "-m", "gpupool.service.shim", "--exit-file"]
        argv += [str(self._record), "--spec-fd", str(read_end)]
        header = f"== attempt {spec.attempt} ==\n".encode()
        try:
            try:
                with (
                    open(stdout, "ab", buffering=0) as out,
                    open(stderr, "ab", buffering=0) as err,
                ):
                    out.write(header)
                    err.write(header)
                    self._proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        env={"PATH": DEFAULT_PATH},
                        start_new_session=True,
                        pass_fds=(read_end,),
                    )
            finally:
                os.close(read_end)
            with open(write_end, "wb", closefd=False) as pipe:
                pipe.write(json.dumps(job).encode())
        finally:
            os.close(write_end)
        self._ticks = read_start_ticks(self._proc.pid, zombie_ok=True) or 0
        return self.pid()

    def node_id(self) -> str:
        return self._node_id

    def pid(self) -> tuple[int, int]:
        """(pid, start ticks) of the shim, which leads the job's process group; (0, 0)
        for a gang member not started yet."""
        if self._proc is None:
            return 0, 0
        return self._proc.pid, self._ticks

    def signal(self, sig: int) -> bool:
        """Send `sig` to the job's process group; False if the job has already ended."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            os.killpg(self._proc.pid, sig)
        return True

    def poll(self) -> dict[str, Any] | None:
        """None while the job runs (or, a gang member, waits to start); then how it
        ended, from the shim's exit record."""
        if self._proc is None:
            return None
        status = self._proc.poll()
        if status is None:
            return None
        with contextlib.suppress(OSError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # whatever the shim left behind
        code, sig = (None, -status) if status < 0 else (status, None)
        result: dict[str, Any] = {"exit_code": code, "signal": sig, "record": None}
        try:
            with open(self._record, encoding="utf-8") as f:
                record = json.load(f)
            if isinstance(record, dict):
                result["record"] = record
        except (OSError, ValueError):
            pass
        return result

    def read_log(self, name: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Bytes of stdout.log or stderr.log from `offset`: logs of a node without a
        shared filesystem reach the scheduler this way."""
        if name not in (STDOUT_LOG, STDERR_LOG):
            raise ValueError(f"no log named {name!r}")
        try:
            with open(self._log_dir / name, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except OSError:
            return b""


# --------------------------------------------------------------------------- executor


@dataclass
class _RayJob:
    handle: Handle
    node: str
    actor: Any
    stop_kind: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    deadline_s: float | None = None
    kill_sent: bool = False
    sigterm_at_wall_s: float | None = None
    run_dir: Path | None = None
    members: list[_Member] = field(default_factory=list)
    """A gang's members, rank 0 first (rank 0's actor is `actor`); empty: one node."""
    gang_stop: str | None = None
    """Why the gang's other members are being stopped: one ended badly or vanished."""
    ended: int = 0


@dataclass
class _Member:
    """One member of a gang: its actor, and how it ended once it has."""

    rank: int
    node: str
    actor: Any
    done: bool = False
    vanished: bool = False
    result: Mapping[str, Any] | None = None
    order: int = 0


class RayExecutor:
    """The Executor protocol on a Ray cluster the caller has already joined (ray.init).

    `nodes` maps gpupool node names to Ray node ids; when omitted (or a name is missing)
    it is filled from :func:`ray_nodes`. `launch` runs on `default_node`; use
    :meth:`launch_on` to name the node per attempt. Actors are detached and named
    ``gpupool-job-<job_id>`` in `namespace`, so jobs outlive the scheduler and `adopt`
    finds them again. `python` must exist at the same path on every node."""

    def __init__(
        self,
        nodes: Mapping[str, str] | None = None,
        *,
        default_node: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        python: str = sys.executable,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        import ray

        self._ray: Any = ray  # actor handles are dynamic: typed loosely on purpose
        self._nodes: dict[str, str] = dict(nodes or {})
        self._default_node = default_node
        self._namespace = namespace
        self._python = python
        self._timeout = call_timeout_s
        self._actor_cls: Any = ray.remote(JobActor)
        self._jobs: dict[str, _RayJob] = {}
        self._dead: list[Exit] = []
        """Ends found outside poll (a gang adopted only in part), reported by the next."""

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

    def launch_many(
        self, launches: Sequence[tuple[LaunchSpec, str]], now_s: float
    ) -> list[Handle | GpupoolError]:
        """Start several attempts at once: every actor is created before any is waited
        for, so a cycle that starts N jobs waits for the slowest worker start, not the
        sum. One result per launch, in order: its handle, or the error that stopped it."""
        from ray.exceptions import GetTimeoutError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        started: list[tuple[LaunchSpec, str, Any, Any] | GpupoolError | None] = []
        gangs: list[LaunchSpec] = []
        for spec, node in launches:
            if spec.gang is not None and len(spec.gang.members) > 1:
                started.append(None)  # started below, once the single-node actors are on
                gangs.append(spec)
                continue
            try:
                _validate(spec)
                if spec.job_id in self._jobs:
                    raise ConflictError(
                        f"job {spec.job_id} is already watched here (attempt "
                        f"{self._jobs[spec.job_id].handle.attempt}); poll until it ends "
                        "before launching it again"
                    )
                ray_node = self.node_id(node)
            except GpupoolError as err:
                started.append(err)
                continue
            name = ACTOR_PREFIX + spec.job_id
            with contextlib.suppress(ValueError):  # an actor left by an earlier attempt
                self._ray.kill(self._ray.get_actor(name, namespace=self._namespace))
            spec = dataclasses.replace(spec, env=dict(spec.env), run_dir=spec.run_dir.absolute())
            actor = self._actor_cls.options(
                name=name,
                namespace=self._namespace,
                lifetime="detached",
                num_cpus=0,
                num_gpus=0,
                resources={gpu_resource(node, i): 1.0 for i in spec.gpu_indices},
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False),
                max_concurrency=4,
                max_restarts=0,
            ).remote(spec, node, self._python)
            started.append((spec, node, actor, actor.pid.remote()))
        deadline = time.monotonic() + self.START_TIMEOUT_S
        out: list[Handle | GpupoolError] = []
        for item in started:
            if item is None:
                out.append(self._launch_gang(gangs.pop(0)))
                continue
            if isinstance(item, GpupoolError):
                out.append(item)
                continue
            spec, node, actor, ref = item
            try:
                pid, ticks = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except GetTimeoutError:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor)
                out.append(
                    Unavailable(
                        f"job {spec.job_id}: node {node} did not start its actor within "
                        f"{self.START_TIMEOUT_S:.0f} s; it is requeued"
                    )
                )
                continue
            except Exception as e:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor)
                out.append(SpecError(f"job {spec.job_id}: cannot start on node {node}: {e}"))
                continue
            handle = Handle(spec.job_id, spec.attempt, pid, pid, ticks)
            self._jobs[spec.job_id] = _RayJob(handle, node, actor, run_dir=spec.run_dir)
            out.append(handle)
        return out

    def _launch_gang(self, spec: LaunchSpec) -> Handle | GpupoolError:
        """All members or none: every actor is placed, rank 0's finds the rendezvous port,
        then all start; if any cannot, those started are killed and the job is requeued."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        gang = spec.gang
        assert gang is not None
        members = gang.members
        try:
            _validate(spec)
            if spec.job_id in self._jobs:
                raise ConflictError(
                    f"job {spec.job_id} is already watched here; poll until it ends before "
                    "launching it again"
                )
            ray_ids = [self.node_id(m.node) for m in members]
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
        actors: list[Any] = []
        for rank, (m, ray_node) in enumerate(zip(members, ray_ids, strict=True)):
            name = actor_name(spec.job_id, rank)
            with contextlib.suppress(ValueError):  # an actor left by an earlier attempt
                self._ray.kill(self._ray.get_actor(name, namespace=self._namespace))
            env = dict(spec.env)
            if "GPUPOOL_FAKE_GPUS" in env:  # a fake fleet: this member's fake GPUs
                env["GPUPOOL_FAKE_GPUS"] = ",".join(str(i) for i in m.gpu_indices)
            mspec = dataclasses.replace(spec, env=env, gpu_indices=m.gpu_indices, gang=None)
            actors.append(
                self._actor_cls.options(
                    name=name,
                    namespace=self._namespace,
                    lifetime="detached",
                    num_cpus=0,
                    num_gpus=0,
                    resources={gpu_resource(m.node, i): 1.0 for i in m.gpu_indices},
                    scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False),
                    max_concurrency=4,
                    max_restarts=0,
                ).remote(mspec, m.node, self._python, rank)
            )
        deadline = time.monotonic() + self.START_TIMEOUT_S
        where = ", ".join(f"{m.node}:{','.join(map(str, m.gpu_indices))}" for m in members)
        try:
            addr, port = self._ray.get(actors[0].endpoint.remote(), timeout=self.START_TIMEOUT_S)
            refs = [
                actor.start.remote(gang_env(members, rank, addr, port))
                for rank, actor in enumerate(actors)
            ]
            pids = [
                self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01)) for ref in refs
            ]
        except Exception as err:
            self._kill_all(actors)
            return Unavailable(
                f"job {spec.job_id}: not every member of its gang of {len(members)} nodes "
                f"({where}) started within {self.START_TIMEOUT_S:.0f} s ({type(err).__name__}: "
                f"{err}); the members that did were killed, none runs, it is requeued"
            )
        pid, ticks = pids[0]
        handle = Handle(spec.job_id, spec.attempt, pid, pid, ticks)
        self._jobs[spec.job_id] = _RayJob(
            handle,
            members[0].node,
            actors[0],
            grace_s=gang.grace_s,
            run_dir=run_dir,
            members=[
                _Member(k, m.node, a) for k, (m, a) in enumerate(zip(members, actors, strict=True))
            ],
        )
        return handle

    def _kill_all(self, actors: Sequence[Any]) -> None:
        """SIGKILL each actor's job, then the actor (its job's fence would kill it too)."""
        refs = []
        for actor in actors:
            with contextlib.suppress(Exception):
                refs.append(actor.signal.remote(signal.SIGKILL))
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.get(ref, timeout=self._timeout)
        for actor in actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)

    def _adopt_gang(self, handle: Handle, run_dir: Path, layout: list[Any]) -> bool:
        """A gang is adopted whole or not at all: if any member is gone after the restart,
        the live ones are killed and the next poll reports the job lost (requeued)."""
        members: list[_Member] = []
        missing: list[str] = []
        for k, entry in enumerate(layout):
            node = str(entry.get("node", "?")) if isinstance(entry, dict) else "?"
            try:
                actor = self._ray.get_actor(actor_name(handle.job_id, k), namespace=self._namespace)
            except Exception:
                missing.append(f"rank {k} on node {node}")
                continue
            members.append(_Member(k, node, actor))
            try:
                running = self._ray.get(actor.poll.remote(), timeout=self._timeout) is None
                pid = self._ray.get(actor.pid.remote(), timeout=self._timeout)
            except Exception:
                missing.append(f"rank {k} on node {node}")
                continue
            if not running or (k == 0 and tuple(pid) != (handle.pid, handle.start_ticks)):
                missing.append(f"rank {k} on node {node}")
        if not missing and len(members) == len(layout):
            self._jobs[handle.job_id] = _RayJob(
                handle, members[0].node, members[0].actor, run_dir=run_dir, members=members
            )
            return True
        self._kill_all([m.actor for m in members])
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
        """Watch an attempt an earlier scheduler started: True if its actor still runs that
        very process. Stop requests made before the restart are not remembered yet."""
        if handle.job_id in self._jobs:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
        layout = _read_gang(gang_file(run_dir.absolute(), handle.attempt))
        if layout is not None:
            return self._adopt_gang(handle, run_dir.absolute(), layout)
        try:
            actor = self._ray.get_actor(ACTOR_PREFIX + handle.job_id, namespace=self._namespace)
            pid, ticks = self._ray.get(actor.pid.remote(), timeout=self._timeout)
            node_id = self._ray.get(actor.node_id.remote(), timeout=self._timeout)
        except Exception:
            return False
        if (pid, ticks) != (handle.pid, handle.start_ticks):
            return False
        names = {v: k for k, v in self._nodes.items()}
        self._jobs[handle.job_id] = _RayJob(
            handle, names.get(node_id, ""), actor, run_dir=run_dir.absolute()
        )
        return True

    # ---- stopping

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "preempt", grace_s, now_s)

    can_resize = False

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        raise ConflictError(
            f"job {job_id}: the Ray executor cannot resize an elastic job; the service "
            "turns borrowing off on Ray, so elastic jobs run at their full size there"
        )

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        self._stop(job_id, "cancel", grace_s, now_s)

    def _get(self, job_id: str) -> _RayJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(
                f"job {job_id} is not running on this executor; it may have ended already "
                "(poll reports that) or was never launched or adopted here"
            )
        return job

    def _stop(self, job_id: str, kind: str, grace_s: float, now_s: float) -> None:
        job = self._get(job_id)
        grace_s = max(grace_s, 0.0)
        if job.deadline_s is None or now_s + grace_s < job.deadline_s:
            job.deadline_s, job.grace_s = now_s + grace_s, grace_s
        if job.stop_kind != "cancel":
            job.stop_kind = kind
        if job.sigterm_at_wall_s is None:
            job.sigterm_at_wall_s = time.time()
        self._send(job, signal.SIGTERM)
        self._enforce(job, now_s)

    def _send(self, job: _RayJob, sig: int) -> None:
        # A dead actor or node: the next poll reports the job "lost".
        if job.members:  # every member still running, all in flight at once
            refs = []
            for m in job.members:
                if not m.done:
                    with contextlib.suppress(Exception):
                        refs.append(m.actor.signal.remote(sig))
            for ref in refs:
                with contextlib.suppress(Exception):
                    self._ray.get(ref, timeout=self._timeout)
            return
        with contextlib.suppress(Exception):
            self._ray.get(job.actor.signal.remote(sig), timeout=self._timeout)

    def _enforce(self, job: _RayJob, now_s: float) -> None:
        if job.kill_sent or job.deadline_s is None or now_s < job.deadline_s:
            return
        self._send(job, signal.SIGKILL)
        job.kill_sent = True

    # ---- watching

    def poll(self, now_s: float) -> list[Exit]:
        """One round trip to every job's actor, all in flight at once. An actor that
        cannot be reached within the call timeout is asked again next time; one that
        died (with its node) makes the attempt "lost"."""
        from ray.exceptions import GetTimeoutError, RayActorError

        exits: list[Exit] = [dataclasses.replace(e, at_s=now_s) for e in self._dead]
        self._dead.clear()
        for job in self._jobs.values():
            self._enforce(job, now_s)
        refs = {
            job_id: job.actor.poll.remote() for job_id, job in self._jobs.items() if not job.members
        }
        member_refs = {
            (job_id, m.rank): m.actor.poll.remote()
            for job_id, job in self._jobs.items()
            for m in job.members
            if not m.done
        }
        deadline = time.monotonic() + self._timeout
        for job_id in [j for j, job in self._jobs.items() if job.members]:
            ended_gang = self._poll_gang(self._jobs[job_id], member_refs, deadline, now_s)
            if ended_gang is not None:
                exits.append(ended_gang)
                for m in self._jobs[job_id].members:
                    if not m.vanished:
                        self._collect_logs(self._jobs[job_id], m)
                self._forget(job_id)
        for job_id, ref in refs.items():
            job = self._jobs[job_id]
            try:
                ended = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except GetTimeoutError:
                continue
            except RayActorError:
                exits.append(self._classify(job, None, now_s, vanished=True))
                self._forget(job_id)
                continue
            if ended is None:
                continue
            exits.append(self._classify(job, ended, now_s, vanished=False))
            self._collect_logs(job)
            self._forget(job_id)
        return exits

    def _poll_gang(
        self, job: _RayJob, refs: Mapping[tuple[str, int], Any], deadline: float, now_s: float
    ) -> Exit | None:
        """Note which members ended; the first to end badly (or vanish with its node)
        stops all the others (SIGTERM, SIGKILL after the grace period). The gang's Exit
        comes once every member has ended: no member is left running alone."""
        from ray.exceptions import GetTimeoutError, RayActorError

        h = job.handle
        for m in job.members:
            ref = refs.get((h.job_id, m.rank))
            if m.done or ref is None:
                continue
            try:
                ended = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except GetTimeoutError:
                continue
            except RayActorError:
                m.vanished = True
            else:
                if ended is None:
                    continue
                m.result = ended
            m.done, job.ended, m.order = True, job.ended + 1, job.ended + 1
            bad = m.vanished or self._member_exit(job, m, now_s).outcome != SUCCEEDED
            if bad and job.stop_kind is None and job.gang_stop is None:
                job.gang_stop = f"gang member rank {m.rank} on node {m.node}"
                job.deadline_s = now_s + job.grace_s
                job.sigterm_at_wall_s = time.time()
                self._send(job, signal.SIGTERM)
        if not all(m.done for m in job.members):
            return None
        return self._gang_exit(job, now_s)

    def _member_exit(self, job: _RayJob, m: _Member, now_s: float) -> Exit:
        """How one member ended, by the rules of a single job: a stop the scheduler asked
        for counts; the gang's own stop of the others does not."""
        if m.vanished or m.result is None:
            return self._classify(job, None, now_s, vanished=True)
        stop_kind, kill_sent = job.stop_kind, job.kill_sent
        if stop_kind is None:  # a member ended by itself: judged as it ended
            job.kill_sent = False
        try:
            return self._classify(job, m.result, now_s, vanished=False)
        finally:
            job.stop_kind, job.kill_sent = stop_kind, kill_sent

    def _gang_exit(self, job: _RayJob, now_s: float) -> Exit:
        h = job.handle
        n = len(job.members)
        by_order = sorted(job.members, key=lambda m: m.order)
        lost = [m for m in by_order if m.vanished]
        if lost:
            m = lost[0]
            return Exit(
                h.job_id,
                h.attempt,
                LOST,
                None,
                None,
                f"gang member rank {m.rank} on node {m.node} was lost (its Ray node died or "
                f"left the cluster); all {n} members were stopped: requeue the job, it "
                "resumes from its last checkpoint with a new gang",
                now_s,
                node=m.node,
            )
        ends = {m.rank: self._member_exit(job, m, now_s) for m in job.members}
        if job.stop_kind is not None:  # preempted or cancelled: the worst member's end
            killed = [e for e in ends.values() if e.signal == signal.SIGKILL]
            ex = killed[0] if killed else ends[0]
            return dataclasses.replace(ex, reason=f"{ex.reason} (all {n} members of the gang)")
        if job.gang_stop is not None:
            first = next(m for m in by_order if ends[m.rank].outcome != SUCCEEDED)
            ex = ends[first.rank]
            return dataclasses.replace(
                ex,
                reason=(
                    f"gang member rank {first.rank} on node {first.node}: {ex.reason}; the "
                    f"other {n - 1} members were stopped (SIGTERM, SIGKILL after "
                    f"{job.grace_s:g} s)"
                ),
            )
        return dataclasses.replace(ends[0], reason=f"{ends[0].reason} (all {n} members)")

    LOG_TAIL_LIMIT = 64 << 20

    def _collect_logs(self, job: _RayJob, member: _Member | None = None) -> None:
        """Before its actor goes, copy what the scheduler's run directory lacks of the
        job's logs from its node (nothing on a shared filesystem, where sizes match);
        a gang member's go to ``rank-<k>/``."""
        if job.run_dir is None:
            return
        actor, local_dir = job.actor, job.run_dir
        if member is not None:
            actor = member.actor
            local_dir = job.run_dir / member_dir(member.rank) if member.rank else job.run_dir
        for name in (STDOUT_LOG, STDERR_LOG):
            local = local_dir / name
            have = local.stat().st_size if local.is_file() else 0
            try:
                data: bytes = self._ray.get(
                    actor.read_log.remote(name, have, self.LOG_TAIL_LIMIT),
                    timeout=self._timeout,
                )
            except Exception:  # the node went: what was streamed is what there is
                return
            if data:
                local_dir.mkdir(parents=True, exist_ok=True)
                with local.open("ab") as f:
                    f.write(data)

    def _classify(
        self, job: _RayJob, ended: Mapping[str, Any] | None, now_s: float, *, vanished: bool
    ) -> Exit:
        h = job.handle
        stop_kind, kill_sent = job.stop_kind, job.kill_sent
        code: int | None = None
        sig: int | None = None
        error: str | None = None
        if vanished:
            # Actor died with its node: the process is gone with it (machine lost), and
            # even if we sent SIGKILL the node loss is the news; it resumes elsewhere.
            return Exit(
                h.job_id,
                h.attempt,
                "lost",
                None,
                None,
                f"the Ray node of gpupool node {job.node or '?'} died or left the cluster "
                "(its actor is gone); requeue the job, it resumes from its last checkpoint",
                now_s,
            )
        assert ended is not None
        code, sig = ended.get("exit_code"), ended.get("signal")
        record = ended.get("record")
        if isinstance(record, dict):
            ended_at = record.get("ended_at")
            sent = job.sigterm_at_wall_s
            if isinstance(ended_at, int | float) and sent is not None and ended_at < sent:
                stop_kind, kill_sent = None, False
            rc, rs, re_ = (record.get(k) for k in ("exit_code", "signal", "error"))
            code = rc if isinstance(rc, int) else None
            sig = rs if isinstance(rs, int) else None
            error = re_ if isinstance(re_, str) else None
        return classify(
            h.job_id,
            h.attempt,
            exit_code=code,
            signal_num=sig,
            at_s=now_s,
            stop_kind=stop_kind,
            kill_sent=kill_sent,
            grace_s=job.grace_s,
            error=error,
        )

    def _forget(self, job_id: str) -> None:
        job = self._jobs.pop(job_id)
        for actor in [m.actor for m in job.members] or [job.actor]:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)  # frees its GPU-index resources at once

    def read_log(
        self, job_id: str, name: str = STDOUT_LOG, offset: int = 0, rank: int = 0
    ) -> bytes:
        """Log bytes of a running job (of gang member `rank`), read on its node by its actor."""
        job = self._get(job_id)
        actor = job.actor
        if rank:
            if rank >= len(job.members):
                raise NotFoundError(
                    f"job {job_id} has no gang member of rank {rank}; it runs "
                    f"{max(len(job.members), 1)} member(s), ranks from 0"
                )
            actor = job.members[rank].actor
        data: bytes = self._ray.get(actor.read_log.remote(name, offset), timeout=self._timeout)
        return data

    def actor_node_id(self, job_id: str) -> str:
        """The Ray node id the job's actor runs on, as the actor itself reports it."""
        node: str = self._ray.get(self._get(job_id).actor.node_id.remote(), timeout=self._timeout)
        return node

    def handles(self) -> dict[str, Handle]:
        return {job_id: j.handle for job_id, j in self._jobs.items()}

    def shutdown(self) -> None:
        """Stop watching; the detached actors and their jobs keep running for adoption."""
        self._jobs.clear()


if TYPE_CHECKING:
    _RAY: Executor = RayExecutor()
