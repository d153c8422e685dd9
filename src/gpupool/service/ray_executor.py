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
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.service.executor import (
    CHECKPOINT_DIR,
    DEFAULT_GRACE_S,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_PATH,
    HOME_DIR,
    STDERR_LOG,
    STDOUT_LOG,
    Exit,
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

    def __init__(self, spec: LaunchSpec, node: str, python: str) -> None:
        import ray

        self._node_id = str(ray.get_runtime_context().get_node_id())
        run_dir = spec.run_dir.absolute()
        (run_dir / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / HOME_DIR).mkdir(exist_ok=True)
        self._run_dir = run_dir
        self._record = exit_file(run_dir, spec.attempt)
        for stale in (self._record, stop_file(run_dir, spec.attempt)):
            stale.unlink(missing_ok=True)
        env = job_environment(spec)
        env["GPUPOOL_NODE"] = node
        env["GPUPOOL_RAY_NODE_ID"] = self._node_id
        # The shim gets the job over a pipe, as under LocalExecutor: its own interpreter
        # runs isolated (-I) in a clean environment, the job's applies to the job only.
        job = {
            "argv": list(spec.argv),
            "env": env,
            "cwd": str(spec.cwd) if spec.cwd is not None else None,
            "stdout": str(run_dir / STDOUT_LOG),
            "stderr": str(run_dir / STDERR_LOG),
            "log_max_bytes": DEFAULT_LOG_MAX_BYTES,
            "fence_ppid": os.getpid(),  # the job dies with this actor's node
        }
        read_end, write_end = os.pipe()
        argv = [python, "-I", "-m", "gpupool.service.shim", "--exit-file", str(self._record)]
        argv += ["--spec-fd", str(read_end)]
        header = f"== attempt {spec.attempt} ==\n".encode()
        try:
            try:
                with (
                    open(run_dir / STDOUT_LOG, "ab", buffering=0) as out,
                    open(run_dir / STDERR_LOG, "ab", buffering=0) as err,
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

    def node_id(self) -> str:
        return self._node_id

    def pid(self) -> tuple[int, int]:
        """(pid, start ticks) of the shim, which leads the job's process group."""
        return self._proc.pid, self._ticks

    def signal(self, sig: int) -> bool:
        """Send `sig` to the job's process group; False if the job has already ended."""
        if self._proc.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            os.killpg(self._proc.pid, sig)
        return True

    def poll(self) -> dict[str, Any] | None:
        """None while the job runs; then how it ended, from the shim's exit record."""
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
            with open(self._run_dir / name, "rb") as f:
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

    def launch_many(
        self, launches: Sequence[tuple[LaunchSpec, str]], now_s: float
    ) -> list[Handle | GpupoolError]:
        """Start several attempts at once: every actor is created before any is waited
        for, so a cycle that starts N jobs waits for the slowest worker start, not the
        sum. One result per launch, in order: its handle, or the error that stopped it."""
        from ray.exceptions import GetTimeoutError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        started: list[tuple[LaunchSpec, str, Any, Any] | GpupoolError] = []
        for spec, node in launches:
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

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """Watch an attempt an earlier scheduler started: True if its actor still runs that
        very process. Stop requests made before the restart are not remembered yet."""
        if handle.job_id in self._jobs:
            raise ConflictError(f"job {handle.job_id} is already watched by this executor")
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

        for job in self._jobs.values():
            self._enforce(job, now_s)
        refs = {job_id: job.actor.poll.remote() for job_id, job in self._jobs.items()}
        deadline = time.monotonic() + self._timeout
        exits: list[Exit] = []
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

    LOG_TAIL_LIMIT = 64 << 20

    def _collect_logs(self, job: _RayJob) -> None:
        """Before its actor goes, copy what the scheduler's run directory lacks of the
        job's logs from its node (nothing on a shared filesystem, where sizes match)."""
        if job.run_dir is None:
            return
        for name in (STDOUT_LOG, STDERR_LOG):
            local = job.run_dir / name
            have = local.stat().st_size if local.is_file() else 0
            try:
                data: bytes = self._ray.get(
                    job.actor.read_log.remote(name, have, self.LOG_TAIL_LIMIT),
                    timeout=self._timeout,
                )
            except Exception:  # the node went: what was streamed is what there is
                return
            if data:
                job.run_dir.mkdir(parents=True, exist_ok=True)
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
        with contextlib.suppress(Exception):
            self._ray.kill(job.actor)  # frees its GPU-index resources at once

    def read_log(self, job_id: str, name: str = STDOUT_LOG, offset: int = 0) -> bytes:
        """Log bytes of a running job, read on its node by its actor."""
        job = self._get(job_id)
        data: bytes = self._ray.get(job.actor.read_log.remote(name, offset), timeout=self._timeout)
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
