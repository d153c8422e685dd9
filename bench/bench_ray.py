"""The live service on a real multi-node Ray cluster: launch latency and scheduler CPU.

1. Submit to process start: 200 one-GPU jobs go through the real HTTP API (uvicorn on
   127.0.0.1, an ephemeral port) at a steady rate to a LiveService built by
   `ray_service()` (SystemClock, SQLite, its own loop thread), on a Ray cluster this
   script starts like tests/ray/conftest.py: a head without GPUs and three gpupool nodes
   a1, a2 (A100-80GB) and h1 (H100-80GB). Each job is
   `python -S -c "t = time.time(); ..."` (no `site` import, so what is timed is the
   process starting, not site-packages being read) writing that time to a file. Latency =
   that time - the client's time.time() just before the POST. The path is broken down
   with timing shims (set on the instances here, the library is untouched): submit ->
   the loop step that launched it begins (the job's started_at) -> RayExecutor.launch_many
   called -> it returned (the node's warm launcher Popen'd the shim) -> the job's first
   action (shim and job Python start-up).
2. Scheduler CPU per decision: `time.thread_time()` (the loop thread's own CPU) around
   each `live.scheduler.cycle(now)` call, divided by its decisions (Launch/Stop); and
   around each whole `live.step()`, per launch (includes reaping, the launcher calls and
   the database writes). Process-wide CPU (API + loop + Ray driver threads) and the CPU
   of every process this script started (Ray's GCS, raylets, workers, jobs) per job are
   reported too.

Each node declares enough fake GPUs (72, 216 in all) that no job waits for a GPU. The
default rate (0.5/s) measures one launch at a time; `--rate 20 --tag burst` submits the
200 jobs within 10 s, so cycles launch several at once (`launch_many`: one `start_many`
call per node's launcher, all in flight before any is awaited).

Containment (`--contain`, the default when run as root, as `gpupool serve` contains jobs
then; `--no-contain` to measure without): the RayExecutor is built as `gpupool serve --ray`
builds it with isolation on, AgentSettings(contain=True, log_max_bytes=...) and an enabled
`Isolation` creating team users, so each node's launcher starts every attempt in its own
cgroup (`cgroups.detect()` on the node), as the team's Unix user (gpupool-bench), logs
capped. The state directory is secured as serve does (`Isolation.secure_state`: 0711, the
run directories reachable by the job's user); the jobs run `--job-python` (default
/usr/bin/python3, which any user can run; the same in both modes) and write their marks
into a 0o1777 directory under /tmp. Results record whether containment was on, the cgroup
hierarchy, how many jobs ran as the team's user (owner of its mark file) and how many
attempts had a cgroup (their launch records).

Ray probes an outside address, so this runs only in a loopback-only network namespace:

    RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$@"' sh \\
        .venv/bin/python bench/bench_ray.py

Writes bench/results/ray.json and ray.md (ray-TAG.* with --tag), with `-contained` at the
end of the name when containment is on (ray-contained.*, ray-burst-contained.*).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from machine import describe

ROOT = Path(__file__).resolve().parents[1]
HOW = (
    "bench_ray.py needs a loopback-only network namespace (Ray probes an outside address); "
    "run it as:\n  cd /work/main && RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c "
    "'ip link set lo up && exec \"$@\"' sh .venv/bin/python bench/bench_ray.py"
)
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
MODELS = {"a1": "A100-80GB", "a2": "A100-80GB", "h1": "H100-80GB"}
JOB_CODE = "import time,sys; t=time.time(); open(sys.argv[1],'w').write(repr(t))"


def loopback_only() -> bool:
    try:
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def stats(values: list[float], scale: float = 1000.0, nd: int = 1) -> dict[str, float]:
    """p50/p90/p99/max/mean of `values` (seconds), in ms by default."""
    a = np.asarray(values, dtype=float) * scale
    if a.size == 0:
        return {}
    return {
        "n": int(a.size),
        "p50": round(float(np.percentile(a, 50)), nd),
        "p90": round(float(np.percentile(a, 90)), nd),
        "p99": round(float(np.percentile(a, 99)), nd),
        "max": round(float(a.max()), nd),
        "mean": round(float(a.mean()), nd),
    }


# ---- CPU of every process this script started ------------------------------------------------
def _proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (ppid, start ticks, own CPU seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[int, int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        f = raw[raw.rfind(b")") + 2 :].split()
        out[int(name)] = (int(f[1]), int(f[19]), (int(f[11]) + int(f[12])) / tick)
    return out


class TreeCpu:
    """CPU of this process's descendants (Ray's GCS, raylets, workers, shims, jobs),
    sampled every `every_s`: Ray's processes do not leave their children's CPU in
    cutime, so each process is followed while it lives (what one spends in its last
    `every_s` before exiting, and processes shorter than that, are missed)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.base: dict[tuple[int, int], float] = {}
        self.last: dict[tuple[int, int], float] = {}
        self.own_cpu_s = 0.0
        """This sampler's own CPU (in this process), to leave out of the process figure."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="tree-cpu", daemon=True)

    def _sample(self) -> dict[tuple[int, int], float]:
        table = _proc_table()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        found: dict[tuple[int, int], float] = {}
        todo = list(kids.get(os.getpid(), []))
        while todo:
            pid = todo.pop()
            _, ticks, cpu = table[pid]
            found[(pid, ticks)] = cpu
            todo += kids.get(pid, [])
        return found

    def _loop(self) -> None:
        c0 = time.thread_time()
        while not self.done.wait(self.every_s):
            self.last.update(self._sample())
        self.own_cpu_s = time.thread_time() - c0

    def start(self) -> TreeCpu:
        self.base = self._sample()
        self.last = dict(self.base)
        self.thread.start()
        return self

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        self.last.update(self._sample())
        return sum(cpu - self.base.get(key, 0.0) for key, cpu in self.last.items())


# ---- the cluster, the service, the API ---------------------------------------------------------
@contextlib.contextmanager
def ray_cluster(gpus_per_node: int) -> Iterator[dict[str, str]]:
    from ray.cluster_utils import Cluster

    import ray
    from gpupool.server.executors.ray_nodes import node_resources

    small = {"object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": FAST_HEALTH, **small},
    )
    try:
        nodes = {
            name: cluster.add_node(
                num_cpus=1,
                num_gpus=0,
                resources=node_resources(name, model, gpus_per_node),
                **small,
            )
            for name, model in MODELS.items()
        }
        ray.init(address=cluster.address, namespace="gpupool-bench", log_to_driver=False)
        cluster.wait_for_nodes()
        yield {name: node.node_id for name, node in nodes.items()}
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()


class ApiServer:
    """uvicorn on 127.0.0.1 with an ephemeral port, in a thread of this process (as
    `gpupool serve` runs the API and the loop in one process)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> ApiServer:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError("the API did not come up")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class Probes:
    """Timing shims on one LiveService instance (the library is not changed)."""

    def __init__(self, live: Any) -> None:
        self.live = live
        self.cycles: list[tuple[float, float, int, int]] = []  # cpu, wall, launches, stops
        self.steps: list[tuple[float, float, float, int]] = []  # start, cpu, wall, launches
        self.launch_call: dict[str, tuple[float, float, float]] = {}  # job -> begin, end, cpu
        self.step_begin: dict[str, float] = {}  # job -> wall time its step began
        self.current_step = 0.0
        from gpupool.scheduler import Launch

        cycle, step = live.scheduler.cycle, live.step
        launch_many = live.executor.launch_many

        def timed_cycle(now: float) -> Any:
            c0, w0 = time.thread_time(), time.perf_counter()
            decisions = cycle(now)
            c1, w1 = time.thread_time(), time.perf_counter()
            launches = sum(isinstance(d, Launch) for d in decisions)
            self.cycles.append((c1 - c0, w1 - w0, launches, len(decisions) - launches))
            return decisions

        def timed_step() -> None:
            before = len(live.record.decisions)
            self.current_step = time.time()
            c0, w0 = time.thread_time(), time.perf_counter()
            step()
            c1, w1 = time.thread_time(), time.perf_counter()
            self.steps.append(
                (self.current_step, c1 - c0, w1 - w0, len(live.record.decisions) - before)
            )

        def timed_launch_many(items: Any, now_s: float) -> Any:
            c0, t0 = time.thread_time(), time.time()
            try:
                return launch_many(items, now_s)
            finally:
                t1, cpu = time.time(), (time.thread_time() - c0) / max(len(items), 1)
                for spec, _ in items:
                    self.step_begin[spec.job_id] = self.current_step
                    self.launch_call[spec.job_id] = (t0, t1, cpu)

        live.scheduler.cycle = timed_cycle
        live.step = timed_step
        live.executor.launch_many = timed_launch_many


# ---- the run -----------------------------------------------------------------------------------
def submit_all(
    client: Any,
    url: str,
    count: int,
    rate: float,
    marks: Path,
    tag: str,
    on_tick: Callable[[int], None],
    python: str,
) -> dict[int, tuple[float, float, Path]]:
    """POST `count` jobs at `rate` per second: job id -> (submit time, answered, mark file)."""
    out: dict[int, tuple[float, float, Path]] = {}
    begin = time.monotonic()
    for i in range(count):
        wait = begin + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        mark = marks / f"{tag}-{i}"
        body = {
            "command": [python, "-S", "-c", JOB_CODE, str(mark)],
            "team": "bench",
            "kind": "offline-inference",
            "gpus": 1,
        }
        t0 = time.time()
        r = client.post(f"{url}/v1/jobs", json=body)
        t1 = time.time()
        if r.status_code != 201:
            raise RuntimeError(f"submit failed: {r.status_code} {r.text}")
        out[int(r.json()["id"])] = (t0, t1, mark)
        on_tick(i + 1)
    return out


def wait_done(
    store: Any, jobs: dict[int, tuple[float, float, Path]], timeout_s: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_s
    last = 0.0
    while True:
        started = sum(1 for _, _, m in jobs.values() if m.exists())
        states = [store.jobs.get(j).state for j in jobs]
        done = sum(s in ("succeeded", "failed", "cancelled") for s in states)
        if time.monotonic() - last >= 2 or done == len(jobs):
            print(f"  {what}: {started}/{len(jobs)} started, {done} ended  [{loadavg()}]")
            last = time.monotonic()
        if done == len(jobs):
            bad = [j for j, s in zip(jobs, states, strict=True) if s != "succeeded"]
            if bad:
                raise RuntimeError(f"jobs did not succeed: {[(j, store.jobs.get(j)) for j in bad]}")
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}: {started} started, {done} ended")
        time.sleep(0.2)


def python_startup_ms(python: str, n: int = 20) -> float:
    """`python -S -c pass` alone, median, for reference."""
    import subprocess

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([python, "-S", "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return round(1000 * float(np.median(times)), 1)


def containment_setup(contain: bool) -> tuple[Any, Any, dict[str, Any]]:
    """The RayExecutor's `agent` and `isolation` arguments as `gpupool serve --ray` builds
    them (main._ray_live), and what the results say of them."""
    from gpupool.server.executors.ray_launcher import AgentSettings
    from gpupool.server.isolation import cgroups as cg
    from gpupool.server.isolation.containment import Isolation, IsolationConfig

    if not contain:
        return AgentSettings(), None, {"on": False}
    isolation = Isolation(IsolationConfig(enabled=True, create_users=True))
    agent = AgentSettings(contain=True, log_max_bytes=isolation.log_max_bytes)
    cgroups, note = cg.detect()  # what each node's launcher finds (all on this machine)
    return (
        agent,
        isolation,
        {
            "on": True,
            "how": "AgentSettings(contain=True) + Isolation(enabled, create_users): "
            "each attempt in its own cgroup, run as the team's user, logs capped",
            "cgroups": note,
            "cgroup_version": cgroups.version if cgroups is not None else None,
            "log_max_bytes": isolation.log_max_bytes,
        },
    )


def contained_counts(
    jobs: dict[int, tuple[float, float, Path]], run_dir: Callable[[int], Path]
) -> tuple[list[int], int]:
    """The owner of each job's mark file (the user it ran as) and how many attempts had a
    cgroup (the launch record the node's launcher wrote in the run directory: all nodes
    are on this machine)."""
    uids = [m.stat().st_uid for _, _, m in jobs.values()]
    with_cgroup = 0
    for job_id in jobs:
        for f in run_dir(job_id).glob("launch-*.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(f.read_text()).get("cgroup"):
                    with_cgroup += 1
    return uids, with_cgroup


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    import ray
    from gpupool.domain.quota import TeamQuota
    from gpupool.ports.clock.base import SystemClock
    from gpupool.server.api.app import create_app
    from gpupool.server.executors.ray import RayExecutor
    from gpupool.server.isolation.containment import sqlite_file
    from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
    from gpupool.server.loop.driver import ray_service
    from gpupool.server.store import Store, database_url

    agent, isolation, contained = containment_setup(args.contain)
    pgids: list[int] = []
    umask = os.umask(0o022)
    os.umask(umask)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-ray-") as tmp_s:
        tmp = Path(tmp_s)
        marks = tmp / "marks"
        marks.mkdir()
        if isolation is not None:  # the team's user reaches its run directory, writes marks
            os.chmod(tmp, 0o711)
            os.chmod(marks, 0o1777)
        print(f"starting Ray {ray.__version__}: head + a1, a2, h1 with {args.gpus} GPUs each")
        t_cluster = time.perf_counter()
        with ray_cluster(args.gpus) as ids:
            print(f"  cluster up in {time.perf_counter() - t_cluster:.1f} s")
            store = Store(database_url(None, tmp / "db"))
            store.migrate()
            config = LiveConfig(
                state_dir=tmp / "state",
                scheduling=dataclasses.replace(
                    LIVE_DEFAULTS,
                    teams=(TeamQuota("bench", {}, {}),),
                    max_starts_per_cycle=16,  # as `gpupool serve --ray` does
                ),
                host="ray",
            )
            executor = RayExecutor(ids, namespace="gpupool-bench", agent=agent, isolation=isolation)
            live = ray_service(config, store, SystemClock(), executor=executor)
            if isolation is not None:  # as `gpupool serve` does before any job starts
                isolation.secure_state(
                    config.state_dir, live.jobs_dir, sqlite_file(database_url(None, tmp / "db"))
                )
            probes = Probes(live)
            api = ApiServer(create_app(live, store, auth=False))
            live.start()
            api.start()
            client = httpx.Client(timeout=60)
            all_jobs: dict[int, tuple[float, float, Path]] = {}
            try:
                print(f"API on {api.url}; warm-up: {args.warmup} jobs")
                warm = submit_all(
                    client,
                    api.url,
                    args.warmup,
                    1.0,
                    marks,
                    "warm",
                    lambda _: None,
                    args.job_python,
                )
                all_jobs.update(warm)
                wait_done(store, warm, 120, "warm-up")
                n_cycles, n_steps = len(probes.cycles), len(probes.steps)
                load_before = loadavg()
                tree = TreeCpu().start()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                print(f"measuring: {args.jobs} jobs at {args.rate}/s  [{load_before}]")

                def tick(i: int) -> None:
                    if i % 25 == 0:
                        print(f"  submitted {i}/{args.jobs}  [{loadavg()}]")

                jobs = submit_all(
                    client, api.url, args.jobs, args.rate, marks, "job", tick, args.job_python
                )
                submit_span = max(t for t, _, _ in jobs.values()) - min(
                    t for t, _, _ in jobs.values()
                )
                all_jobs.update(jobs)
                wait_done(store, jobs, 600, "measured jobs")
                cpu1, wall1 = time.process_time(), time.perf_counter()
                tree_cpu = tree.stop()
                load_after = loadavg()
            finally:
                client.close()
                api.stop()
                live.stop()
                for job_id in all_jobs:
                    with contextlib.suppress(Exception):
                        pgid = store.jobs.get(job_id).pgid
                        if pgid is not None:
                            pgids.append(pgid)
                for pgid in pgids:
                    with contextlib.suppress(OSError):
                        os.killpg(pgid, signal.SIGKILL)
            rows = {j: store.jobs.get(j) for j in jobs}
            store.close()
        print("Ray cluster stopped")
        os.umask(umask)  # secure_state set 0o077 for this process; the results are public
        uids, with_cgroup = contained_counts(jobs, config.run_dir)
        contained["jobs_run_as_uid"] = {str(u): uids.count(u) for u in sorted(set(uids))}
        contained["attempts_with_cgroup"] = with_cgroup
        if isolation is not None:
            user = isolation.user_for("bench")
            contained["team_user"] = f"{user.name} (uid {user.uid})"

        # ---- latency and its parts
        total, api_rt, to_step, in_step, launch, to_first = [], [], [], [], [], []
        after_last: list[float] = []
        last_submit = max(t for t, _, _ in jobs.values())
        per_node: dict[str, int] = {}
        for job_id, (t_submit, t_answer, mark) in jobs.items():
            first = float(mark.read_text())
            after_last.append(first - last_submit)
            key = str(job_id)
            step_begin = probes.step_begin[key]
            call_begin, call_end, _ = probes.launch_call[key]
            total.append(first - t_submit)
            api_rt.append(t_answer - t_submit)
            to_step.append(step_begin - t_submit)
            in_step.append(call_begin - step_begin)
            launch.append(call_end - call_begin)
            to_first.append(first - call_end)
            node = rows[job_id].node or "?"
            per_node[node] = per_node.get(node, 0) + 1
        warm_lat = [
            float(m.read_text()) - t for t, _, m in warm.values() if m.exists()
        ]  # first launches of a fresh cluster, excluded from the figures

        # ---- CPU
        cyc = probes.cycles[n_cycles:]
        with_dec = [(c, w, lnc + stp) for c, w, lnc, stp in cyc if lnc + stp]
        without = [c for c, _, lnc, stp in cyc if not lnc + stp]
        decisions = sum(d for _, _, d in with_dec)
        steps = probes.steps[n_steps:]
        launch_steps = [(c, w, n) for _, c, w, n in steps if n]
        idle_steps = [c for _, c, _, n in steps if not n]
        launch_cpu = [probes.launch_call[str(j)][2] for j in jobs]
        n = len(jobs)
        results: dict[str, Any] = {
            "machine": describe(),
            "ray": ray.__version__,
            "containment": contained,
            "load_average": {"before": load_before, "after": load_after},
            "layout": {
                "head": "no GPUs, num_cpus=1",
                "nodes": {name: {"model": m, "gpus": args.gpus} for name, m in MODELS.items()},
                "node_num_cpus": 1,
                "all_on_this_machine": True,
            },
            "workload": {
                "jobs": n,
                "warmup_jobs_excluded": args.warmup,
                "rate_per_s": args.rate,
                "submit_span_s": round(submit_span, 2),
                "free_gpus": 3 * args.gpus,
                "gpus_per_job": 1,
                "command": f"{args.job_python} -S -c {JOB_CODE!r} <file>",
                "via": "POST /v1/jobs over HTTP (uvicorn on 127.0.0.1, same process as the loop)",
                "store": "SQLite",
                "cycle_s": config.cycle_s,
                "jobs_per_node": per_node,
                "wall_s": round(wall1 - wall0, 1),
            },
            "latency_ms": {
                "submit_to_process_start": stats(total),
                "last_submit_to_process_start": stats(after_last),
                "jobs_failed": 0,  # wait_done raises unless every job succeeded
                "parts": {
                    "api_round_trip": stats(api_rt),
                    "submit_to_launching_step": stats(to_step),
                    "step_begin_to_launch_call": stats(in_step),
                    "launch_call (node launchers Popen the shims, one batch per cycle)": stats(
                        launch
                    ),
                    "launch_return_to_process_start (shim + job start-up)": stats(to_first),
                },
                "warmup_first_launches": [round(1000 * x, 1) for x in warm_lat],
                "python_S_startup_alone": python_startup_ms(args.job_python),
            },
            "cpu": {
                "scheduler_cycle_per_decision_us": {
                    "mean_over_cycles_with_decisions": round(
                        1e6 * sum(c for c, _, _ in with_dec) / max(decisions, 1), 1
                    ),
                    "per_cycle": stats([c / d for c, _, d in with_dec], 1e6),
                    "cycles_with_decisions": len(with_dec),
                    "decisions": decisions,
                    "decisions_per_cycle_max": max((d for _, _, d in with_dec), default=0),
                },
                "scheduler_cycle_without_decisions_us": stats(without, 1e6),
                "all_cycles_cpu_per_decision_us": round(
                    1e6 * sum(c for c, _, _, _ in cyc) / max(decisions, 1), 1
                ),
                "live_step_per_launch_ms": {
                    "thread_cpu": stats([c / k for c, _, k in launch_steps]),
                    "wall": stats([w / k for _, w, k in launch_steps]),
                    "steps_with_launches": len(launch_steps),
                },
                "live_step_without_launch_cpu_ms": stats(idle_steps, nd=2),
                "launch_thread_cpu_ms": stats(launch_cpu),
                "launches_per_call_max": max(
                    sum(1 for b in probes.launch_call.values() if b[:2] == a[:2])
                    for a in probes.launch_call.values()
                ),
                "process_cpu_per_job_ms": round(1000 * (cpu1 - cpu0 - tree.own_cpu_s) / n, 1),
                "started_processes_cpu_per_job_ms": round(1000 * tree_cpu / n, 1),
                "notes": (
                    "thread CPU is the loop thread's own (time.thread_time); process CPU is "
                    "this whole process (API, loop, Ray driver threads) over the measured "
                    "window; started processes = Ray GCS, raylets, workers (one launcher "
                    "per node), the shims and the jobs, which run on the same 2 cores"
                ),
            },
        }
        return results


def contained_line(c: dict[str, Any]) -> str:
    if not c.get("on"):
        return (
            "**Containment off** (`--no-contain`): the node launchers start each job as Ray's "
            f"user (root here), no cgroup, logs uncapped; jobs by uid: {c.get('jobs_run_as_uid')}."
        )
    return (
        f"**Containment on** (`--contain`, as `gpupool serve` as root): {c['how']}. Cgroups: "
        f"{c['cgroups']} (version {c['cgroup_version']}); log cap {c['log_max_bytes']} bytes; "
        f"team user {c.get('team_user')}. Measured jobs by uid (owner of the file each "
        f"wrote): {c.get('jobs_run_as_uid')}; attempts with a cgroup in their launch record: "
        f"{c.get('attempts_with_cgroup')}."
    )


def markdown(r: dict[str, Any]) -> str:
    m, w, lat, cpu = r["machine"], r["workload"], r["latency_ms"], r["cpu"]
    contained = r.get("containment", {"on": False})
    cyc = cpu["scheduler_cycle_per_decision_us"]

    def row(name: str, s: dict[str, float]) -> str:
        return f"| {name} | {s['p50']} | {s['p90']} | {s['p99']} | {s['max']} | {s['mean']} |"

    lines = [
        "# Live service on Ray: submit to process start, scheduler CPU"
        + (" (jobs contained)" if contained.get("on") else " (jobs not contained)"),
        "",
        contained_line(contained),
        "",
        f"Ray {r['ray']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), "
        f"Python {m['python']}. Load average before / after the measured run: "
        f"`{r['load_average']['before']}` / `{r['load_average']['after']}`.",
        "",
        "Cluster (all processes on this one machine): a head without GPUs and gpupool nodes "
        + ", ".join(
            f"{k} ({v['model']}, {v['gpus']} fake GPUs)" for k, v in r["layout"]["nodes"].items()
        )
        + f", one Ray CPU each. {w['jobs']} one-GPU jobs (after {w['warmup_jobs_excluded']} "
        f"warm-up jobs, not counted) submitted through `POST /v1/jobs` at {w['rate_per_s']}/s "
        f"(over {w['submit_span_s']} s) with {w['free_gpus']} GPUs free, so no job waits for "
        f"a GPU. Jobs per node: {w['jobs_per_node']}. SQLite store, loop cycle "
        f"{w['cycle_s']} s (a submit wakes it), at most 16 starts per cycle (the "
        "`gpupool serve --ray` default).",
        "",
        "The loop launches the jobs one cycle decided together "
        "(`RayExecutor.launch_many`: one `start_many` call to each node's warm launcher, "
        "all in flight before any is awaited); at most "
        f"{cpu['launches_per_call_max']} jobs went out in one call here.",
        "",
        "Each job is `python -S -c ...` writing `time.time()` as its first action (`-S`: no "
        "site import, so the figure is the process start). Latency = that time minus the "
        "client's time just before the POST.",
        "",
        "## Latency (ms)",
        "",
        "| | p50 | p90 | p99 | max | mean |",
        "|---|---|---|---|---|---|",
        row("**submit -> process start**", lat["submit_to_process_start"]),
    ]
    if "last_submit_to_process_start" in lat and w["submit_span_s"] <= 15:  # a burst
        lines.append(row("last submit -> process start", lat["last_submit_to_process_start"]))
    lines += [row(k, v) for k, v in lat["parts"].items()]
    lines += [
        "",
        "The parts after the API round trip add up to the total: submit -> the loop step that "
        "launched the job begins; -> `RayExecutor.launch_many` is called (ingest, reaping, "
        "sampling, the cycle and earlier launches of the same step); the call (the node's "
        "launcher Popens the shim); its return -> the job's first "
        "action (shim and job start-up; in a batch a job's process can start before the "
        "whole call returns, so this part can be negative; "
        f"`python -S -c pass` alone takes "
        f"{lat['python_S_startup_alone']} ms here). Warm-up launches on the fresh cluster: "
        f"{lat['warmup_first_launches']} ms.",
        "",
        "## Scheduler CPU",
        "",
        f"- `scheduler.cycle` per decision (loop thread CPU / Launch+Stop decisions, cycles "
        f"that made any): mean **{cyc['mean_over_cycles_with_decisions']} us**, per cycle p50 "
        f"{cyc['per_cycle']['p50']} us, p99 **{cyc['per_cycle']['p99']} us** "
        f"({cyc['decisions']} decisions in {cyc['cycles_with_decisions']} cycles, at most "
        f"{cyc['decisions_per_cycle_max']} in one).",
        f"- Cycles without decisions: p50 {r['cpu']['scheduler_cycle_without_decisions_us']['p50']}"
        f" us; all cycles' CPU / decisions: {cpu['all_cycles_cpu_per_decision_us']} us.",
        f"- Whole live step per launch (ingest, reap + poll of the node launchers, telemetry, "
        f"node probe, cycle, launcher calls, database writes), loop thread CPU: p50 "
        f"{cpu['live_step_per_launch_ms']['thread_cpu']['p50']} ms, p99 "
        f"{cpu['live_step_per_launch_ms']['thread_cpu']['p99']} ms; wall p50 "
        f"{cpu['live_step_per_launch_ms']['wall']['p50']} ms. Of it, the launch call itself: "
        f"p50 {cpu['launch_thread_cpu_ms']['p50']} ms CPU per job.",
        f"- This process (API + loop + Ray driver threads): {cpu['process_cpu_per_job_ms']} ms "
        f"CPU per job; every process the benchmark started (GCS, raylets, the node launchers' "
        f"workers, shims, jobs): {cpu['started_processes_cpu_per_job_ms']} ms CPU per job.",
        "",
        "Reproduce: `RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "
        f'"$@"\' sh .venv/bin/python bench/bench_ray.py --rate {w["rate_per_s"]:g}'
        + (f" --tag {r['tag']}" if r.get("tag") else "")
        + (" --contain`" if contained.get("on") else " --no-contain`"),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=0.5, help="submissions per second")
    parser.add_argument("--gpus", type=int, default=72, help="fake GPUs per node")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--tag", default="", help="results go to ray-TAG.json / .md")
    parser.add_argument(
        "--contain",
        action=argparse.BooleanOptionalAction,
        default=os.geteuid() == 0,
        help="contain the jobs as `gpupool serve` does as root (cgroup per attempt, the "
        "team's user, log cap); default: on when run as root",
    )
    parser.add_argument(
        "--job-python",
        default="/usr/bin/python3",
        help="the jobs' interpreter (any user must be able to run it)",
    )
    args = parser.parse_args()
    if not loopback_only():
        print(HOW, file=sys.stderr)
        return 2
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        results = run(args)
    except KeyboardInterrupt:
        print("interrupted; the Ray cluster and the jobs were stopped", file=sys.stderr)
        return 130
    args.out.mkdir(parents=True, exist_ok=True)
    results["tag"] = args.tag
    stem = (f"ray-{args.tag}" if args.tag else "ray") + ("-contained" if args.contain else "")
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(markdown(results), encoding="utf-8")
    print(json.dumps(results["latency_ms"], indent=2))
    print(json.dumps(results["cpu"], indent=2))
    print(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
