"""The warm launcher: one long-lived Ray actor per node that starts, watches and signals
the shims of that node's jobs.

A fresh actor per job cost a Ray worker process start (about 0.9 s here, and a node starts
only as many at once as it has CPUs); the launcher is started once, when the executor
first sees the node, and each launch is then one call. Its calls carry everything they
need (the shim's pid and start ticks, the run directory), so a launcher that dies and is
restarted by Ray knows nothing less than the old one: what it must remember lives in a
node-local directory, not in the actor.

What that directory holds, per node:

* ``job-<id>.json``: the attempt this node started for the job, its shim's pid and start
  ticks, its GPU indices and where its exit record goes. The executor adopts a job after
  a scheduler restart from it.
* ``gpu<i>``: the job that claimed GPU index i. A launch is refused while an index it asks
  for is claimed by a job whose shim still runs, so two jobs never hold one index (Ray's
  per-index custom resources gave that guarantee when each job was an actor).

The shim is fenced on the node's raylet (pid and start ticks), not on the launcher: a
replaced launcher leaves its jobs running, and a node that dies takes its jobs with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.errors import GpupoolError
from gpupool.ports.executor.base import LaunchSpec
from gpupool.server.agent.processes import alive, read_start_ticks
from gpupool.server.agent.start import (
    AttemptProcesses,
    Containment,
    LaunchContext,
    start_attempt,
)
from gpupool.server.agent.storage import probe
from gpupool.server.executors.files import (
    CHECKPOINT_DIR,
    DEFAULT_LOG_MAX_BYTES,
    STDERR_LOG,
    STDOUT_LOG,
    read_json,
    write_json,
)
from gpupool.server.isolation import cgroups as cg
from gpupool.server.isolation.containment import agree_user

LAUNCHER_PREFIX = "gpupool-launcher-"
NODE_DIR_ENV = "GPUPOOL_NODE_DIR"
LEAVING_FILE = "leaving"
"""In a node's agent directory while `gpupool node join` drains the node: the launcher
reports it, and the server moves the node's jobs away."""


@dataclass(frozen=True)
class AgentSettings:
    """How the server asks each node's agent to contain jobs: `contain` on makes each
    attempt a cgroup where the node has them (and runs it as its team's user, which the
    LaunchSpec names); `log_max_bytes` caps each log (None: uncapped)."""

    contain: bool = False
    log_max_bytes: int | None = DEFAULT_LOG_MAX_BYTES
    shared_dir: str | None = None
    """The storage every node must reach (checkpoints): each node proves it can write and
    read it, and gets no work while it cannot."""


STORAGE_PROBE_S = 30.0
"""A node's agent proves again that it reaches the shared storage at most this often."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class ShimStart:
    """One shim a node's launcher starts (for the core's `Launch` command): a job, or
    member `rank` of a gang (0: the job's own logs and exit record; k > 0:
    ``rank-<k>/``), with `extra_env` (the gang's rendezvous) on top of the job's
    environment."""

    spec: LaunchSpec
    python: str
    rank: int = 0
    extra_env: Mapping[str, str] = field(default_factory=dict)


def member_dir(rank: int) -> str:
    """Where gang member `rank` (> 0) keeps its logs and exit record in the job's run
    directory; rank 0's are the job's own (``stdout.log``: what `gpupool logs` prints)."""
    return f"rank-{rank}"


def member_key(job_id: str, rank: int = 0) -> str:
    """The name a node's records give a job (rank 0) or gang member `rank`."""
    return job_id + (f"-rank{rank}" if rank else "")


def launcher_name(node: str, ray_node_id: str) -> str:
    """One launcher per node and Ray node id: a node that rejoins gets a new one."""
    return f"{LAUNCHER_PREFIX}{node}-{ray_node_id[:16]}"


def state_root(namespace: str) -> Path:
    """Where the launchers of a namespace keep their node-local state."""
    return Path(tempfile.gettempdir()) / "gpupool-ray" / namespace


def agent_dir(node: str, state_dir: str) -> Path:
    """Where a node's launcher keeps its records: the node directory `gpupool node join`
    gave the node (GPUPOOL_NODE_DIR in its Ray processes' environment), else a
    directory per node under `state_dir` (nodes started another way)."""
    node_dir = os.environ.get(NODE_DIR_ENV, "")
    return Path(node_dir) / "agent" if node_dir else Path(state_dir) / node


class NodeLauncher:
    """Lives on one node for as long as the node; wrapped with ray.remote by RayExecutor
    (threaded, so a signal gets through while a launch runs)."""

    def __init__(self, node: str, state_dir: str, settings: AgentSettings | None = None) -> None:
        import ray

        self._node = node
        self._node_id = str(ray.get_runtime_context().get_node_id())
        self._dir = agent_dir(node, state_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        settings = settings or AgentSettings()
        cgroups, self._cgroups_note = cg.detect() if settings.contain else (None, "")
        self._containment = Containment(cgroups, settings.log_max_bytes)
        node_dir = os.environ.get(NODE_DIR_ENV, "")
        self._runs = Path(node_dir) / "runs" if node_dir else None
        """A joined node keeps its jobs' run directories (logs, records, home) here, not
        at the server's path; their checkpoints stay where every node finds them."""
        self._shared = Path(settings.shared_dir) if settings.shared_dir else None
        self._storage = ""
        self._storage_at = -STORAGE_PROBE_S
        # Ray starts its workers from the raylet: the shims' fence watches it, so jobs
        # live on through a launcher's restart and die with the node
        raylet = os.getppid()
        self._raylet = (raylet, read_start_ticks(raylet) or 0)
        try:  # jobs run at the node's own priority, not at Ray's worker niceness
            self._nice: int | None = os.getpriority(os.PRIO_PROCESS, raylet)
        except OSError:
            self._nice = None
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._priming: threading.Thread | None = None

    # ---- what it is
    def info(self) -> dict[str, Any]:
        """The node, its Ray node id, this launcher's pid and the raylet the shims watch."""
        return {
            "node": self._node,
            "node_id": self._node_id,
            "pid": os.getpid(),
            "raylet": list(self._raylet),
            "dir": str(self._dir),
            "cgroups": self._cgroups_note,
        }

    def node_id(self) -> str:
        return self._node_id

    def status(self) -> dict[str, Any]:
        """What the server asks of each node's agent every second or so: whether the
        machine is leaving (`gpupool node join` is draining it), whether it reaches the
        shared storage ("" or why not; probed at most every STORAGE_PROBE_S), where its
        records are and how it contains jobs."""
        return {
            "leaving": (self._dir / LEAVING_FILE).exists(),
            "storage": self._storage_check(),
            "dir": str(self._dir),
            "cgroups": self._cgroups_note,
            "pid": os.getpid(),
        }

    def _storage_check(self) -> str:
        if self._shared is None:
            return ""
        now = time.monotonic()
        if now - self._storage_at >= STORAGE_PROBE_S:
            self._storage = probe(self._shared, self._node)
            self._storage_at = now
        return self._storage

    # ---- starting
    def endpoint(self) -> tuple[str, int]:
        """This node's address and a port free on it now: a gang's MASTER_ADDR and
        MASTER_PORT when its rank 0 runs here."""
        import ray

        ray_api: Any = ray
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return str(ray_api.util.get_node_ip_address()), port

    def start_many(
        self, launches: Sequence[ShimStart], fence: tuple[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Start each launch; per launch {"pid", "ticks", ...} or {"error"}. `fence`: (key,
        token) of the scheduler that asks: refused when the cluster's key names another
        (a newer scheduler took over, and may have given these jobs away: a start sent
        by one that died meanwhile must not run them twice)."""
        if fence is not None:
            from ray.experimental.internal_kv import _internal_kv_get

            now = _internal_kv_get(fence[0])
            if now is not None and now.decode() != fence[1]:
                why = "a newer scheduler took over this cluster; this start came from an older one"
                return [{"error": f"on node {self._node}: {why}"} for _ in launches]
        self._prime()
        return [self._start(launch) for launch in launches]

    def _prime(self) -> None:
        """Contained: the first move of a shim into its cgroup after a quiet spell waits
        out the kernel's grace period (Cgroups.prime); that wait starts now on a helper
        thread, as LocalExecutor.expect_launch does, so it overlaps the shim's start, the
        directories and the cgroup's creation. At most one at a time."""
        cgroups = self._containment.cgroups
        if cgroups is None or (self._priming is not None and self._priming.is_alive()):
            return
        self._priming = threading.Thread(
            target=cgroups.prime, name="gpupool-cgroup-prime", daemon=True
        )
        self._priming.start()

    def _start(self, launch: ShimStart) -> dict[str, Any]:
        spec, key = launch.spec, member_key(launch.spec.job_id, launch.rank)
        try:
            if self._runs is not None:
                checkpoints = spec.checkpoint_dir or spec.run_dir.absolute() / CHECKPOINT_DIR
                spec = dataclasses.replace(
                    spec, run_dir=self._runs / spec.run_dir.name, checkpoint_dir=checkpoints
                )
            if spec.checkpoint_dir is not None and self._storage_check():
                return {"error": f"on node {self._node}: {self._storage}"}
            run_dir = spec.run_dir.absolute()
            log_dir = run_dir / member_dir(launch.rank) if launch.rank else run_dir
            if spec.user is not None:
                agree_user(spec.user, self._node)
            extra = {**launch.extra_env, "GPUPOOL_NODE": self._node}
            extra["GPUPOOL_RAY_NODE_ID"] = self._node_id
            context = LaunchContext(
                log_dir=log_dir,
                extra_env=extra,
                shim_fields={"fence_watch": list(self._raylet)},
                nice=self._nice,
            )
            with self._lock, self._claims():
                held = self._held(key, spec.attempt, spec.gpu_indices)
                if held:
                    return {"error": held, "conflict": True}
                offsets = {name: _size(log_dir / name) for name in (STDOUT_LOG, STDERR_LOG)}
                started = start_attempt(
                    spec, python=launch.python, containment=self._containment, context=context
                )
                proc = started.proc
                self._children[proc.pid] = proc
                entry = {
                    "job_id": key,
                    "attempt": spec.attempt,
                    "pid": proc.pid,
                    "ticks": started.ticks,
                    "token": started.token,
                    "cgroup": started.cgroup,
                    "gpus": list(spec.gpu_indices),
                    "record": str(started.record),
                    "log_dir": str(log_dir),
                    "log_offsets": offsets,
                }
                write_json(self._dir / f"job-{key}.json", entry)
                for i in spec.gpu_indices:
                    write_json(self._dir / f"gpu{i}", {"job_id": key})
            return {
                "pid": proc.pid,
                "ticks": started.ticks,
                "record": str(started.record),
                "log_dir": str(log_dir),
                "log_offsets": offsets,
            }
        except GpupoolError as e:
            return {"error": f"on node {self._node}: {e}"}
        except OSError as e:
            return {"error": f"cannot start the job's shim on node {self._node}: {e}"}

    def _processes(self, key: str, pid: int) -> AttemptProcesses | None:
        """The attempt's processes (its cgroup, or its launch token) as this node started
        them; None when its record is gone or names another attempt."""
        entry = read_json(self._dir / f"job-{key}.json") if key else None
        if entry is None or int(entry.get("pid", 0)) != pid:
            return None
        token, group = str(entry.get("token", "")), str(entry.get("cgroup", ""))
        return AttemptProcesses(pid, token, group, self._containment.cgroups)

    @contextlib.contextmanager
    def _claims(self) -> Any:
        """An exclusive lock on the node's claims, held across processes: a launcher
        being replaced and its successor never claim at once."""
        with open(self._dir / ".lock", "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _running(self, entry: Mapping[str, Any]) -> bool:
        """Something of the attempt still runs: its shim, or (contained) any process of
        it, an escaped child included; its GPUs are not free before."""
        pid, ticks = int(entry.get("pid", 0)), int(entry.get("ticks", -1))
        if alive(pid, ticks):
            return True
        procs = self._processes(str(entry.get("job_id", "")), pid)
        return procs is not None and bool(procs.members())

    def _kill(self, key: str, pid: int, ticks: int, wait_s: float = 5.0) -> None:
        """SIGKILL an earlier attempt (every process of it) and wait (a little) until its
        shim is gone."""
        procs = self._processes(key, pid)
        if procs is not None:
            procs.signal(signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        proc = self._children.pop(pid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait_s)
            return
        end = time.monotonic() + wait_s
        while alive(pid, ticks) and time.monotonic() < end:
            time.sleep(0.01)

    def _held(self, job_id: str, attempt: int, indices: Sequence[int]) -> str:
        """Why the launch must not go ahead ("" if it may): the job already runs here, or
        an index it asks for is claimed by a job whose shim still runs."""
        mine = read_json(self._dir / f"job-{job_id}.json")
        if mine is not None and self._running(mine):
            if int(mine.get("attempt", 0)) >= attempt:
                return (
                    f"job {job_id} already runs on node {self._node} (attempt "
                    f"{mine.get('attempt')}, pid {mine.get('pid')}); stop it before "
                    "launching again"
                )
            # the scheduler gave that attempt up (a launch it saw time out): never twice
            self._kill(job_id, int(mine["pid"]), int(mine["ticks"]))
        for i in indices:
            claim = read_json(self._dir / f"gpu{i}")
            if claim is None:
                continue
            other = str(claim.get("job_id", ""))
            holder = read_json(self._dir / f"job-{other}.json")
            if holder is None or not self._running(holder):
                continue
            if i in holder.get("gpus", []):
                return (
                    f"GPU {i} of node {self._node} is still held by job {other} (pid "
                    f"{holder.get('pid')}); the launch waits until that job has ended"
                )
        return ""

    # ---- watching
    def poll_many(self, jobs: Sequence[tuple[str, int, int, str]]) -> dict[str, Any]:
        """For each (job id, pid, start ticks, exit record path): None while it runs,
        else how it ended, from the shim's exit status and its exit record, with the
        sizes of its logs here (the scheduler fetches only what its copy lacks)."""
        out: dict[str, Any] = {}
        for key, pid, ticks, record in jobs:
            ended = self._poll(key, pid, ticks, record)
            if ended is not None and not ended.get("node_lost"):
                log_dir = Path(record).parent
                sizes = {}
                for name in (STDOUT_LOG, STDERR_LOG):
                    with contextlib.suppress(OSError):
                        sizes[name] = (log_dir / name).stat().st_size
                ended["log_sizes"] = sizes
            out[key] = ended
        return out

    def _poll(self, key: str, pid: int, ticks: int, record_path: str) -> dict[str, Any] | None:
        proc = self._children.get(pid)
        if proc is not None:
            status = proc.poll()
            if status is None:
                return None
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # whatever the shim left behind
            code, sig = (None, -status) if status < 0 else (status, None)
        elif alive(pid, ticks):
            return None  # started by the launcher this one replaced: it runs on
        else:
            code, sig = None, None
        # Ended only once nothing of it is left (escaped children killed, its cgroup
        # gone): until then its GPUs are not free.
        procs = self._processes(key, pid)
        if procs is not None and not procs.end():
            return None
        self._children.pop(pid, None)
        result: dict[str, Any] = {"exit_code": code, "signal": sig, "record": None}
        record = read_json(Path(record_path))
        if record is not None:
            result["record"] = record
            return result
        if not alive(*self._raylet):
            # no record: the shim's fence killed it because the raylet is gone; this
            # worker only outlives its node for a moment
            return {"node_lost": True}
        if proc is None:
            result["signal"] = signal.SIGKILL  # no record and no status: killed outright
        return result

    def signal(self, pid: int, ticks: int, sig: int, key: str = "") -> bool:
        """Send `sig` to the job's process group and to every process of it that left
        the group (`key`: the job or gang member, whose record names its cgroup); False
        if that shim has already ended."""
        proc = self._children.get(pid)
        if proc is not None and proc.poll() is not None:
            return False
        if proc is None and not alive(pid, ticks):
            return False
        procs = self._processes(key, pid)
        if procs is not None:
            procs.signal(sig)
        else:
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
        return True

    def find(self, key: str) -> dict[str, Any] | None:
        """What this node last started for the job (or gang member: `member_key`),
        running or ended but not yet seen to end by the scheduler, with "running" (the
        shim still runs); adoption reads it, and poll then reports how it ended."""
        entry = read_json(self._dir / f"job-{key}.json")
        if entry is not None:
            entry["running"] = self._running(entry)
        return entry

    def release(self, job_id: str, pid: int) -> None:
        """The scheduler has seen the attempt end: its claims go (only that attempt's)."""
        with self._lock, self._claims():
            path = self._dir / f"job-{job_id}.json"
            entry = read_json(path)
            if entry is None or int(entry.get("pid", 0)) != pid:
                return
            for i in entry.get("gpus", []):
                claim = read_json(self._dir / f"gpu{i}")
                if claim is not None and claim.get("job_id") == job_id:
                    (self._dir / f"gpu{i}").unlink(missing_ok=True)
            path.unlink(missing_ok=True)

    def read_logs(self, asks: Sequence[tuple[str, str, int]], limit: int = 1 << 20) -> list[bytes]:
        """For each (log directory, log name, offset): its bytes from the offset (at most
        `limit`): the server copies the logs of its running jobs this way, so a node that
        dies takes at most the last second or so of their output with it."""
        return [self.read_log(d, name, offset, limit) for d, name, offset in asks]

    def read_log(self, log_dir: str, name: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Bytes of a job's stdout.log or stderr.log from `offset`: logs of a node without
        a shared filesystem reach the scheduler this way."""
        if name not in (STDOUT_LOG, STDERR_LOG):
            raise ValueError(f"no log named {name!r}")
        try:
            with open(Path(log_dir) / name, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except OSError:
            return b""
