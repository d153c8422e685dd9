"""`gpupool serve --ray ADDRESS` as a real process, driven by the `gpupool` CLI, on
conftest.py's 3-node Ray cluster: the fleet and its telemetry come from the nodes, a
mix of jobs runs on exactly the node and GPUs the core chose (each job says where it
ran), `gpupool logs` streams a remote job's output, and a killed node shows up in the
events and the metrics while its job is requeued and finishes elsewhere; and a second server
on the same PostgreSQL database stands by and takes the cluster over."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.examples.ckpt_counter import expected_result
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import HTTP, Server, cli, paced_counter, wait_for

PY = sys.executable
UNTIL = (
    "import os, sys, time; "
    "print('where', os.environ['GPUPOOL_NODE'], os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
    "k = 0\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    print('tick', k, flush=True); k += 1; time.sleep(0.2)"
)
WHERE = (
    "import os, sys, time; "
    "print('where', os.environ['GPUPOOL_NODE'], os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
    "[print('tick', k, flush=True) or time.sleep(0.2) for k in range(int(sys.argv[1]))]"
)


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("serve")
    teams = state / "teams.yaml"
    teams.write_text(
        "teams:\n"
        "  - {name: serving, guaranteed: {A100-80GB: 4}}\n"
        "  - {name: ml}\n"
        "preemption: {min_runtime_s: 0}\n"
    )
    srv = Server(
        state,
        "--config",
        str(teams),
        "--ray",
        ray_cluster.cluster.address,
        "--ray-namespace",
        "gpupool-cli-test",
        "--auth",
        "none",
        "--cycle",
        "0.2",
        "--sample",
        "0.5",
    ).start(timeout_s=120)
    try:
        yield srv
    finally:
        srv.stop()
        for pgid in _job_groups(state):
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)


def _job_groups(state: Path) -> list[int]:
    out = []
    for handle in state.glob("jobs/*/handle-*.json"):
        try:
            out.append(int(json.loads(handle.read_text())["pgid"]))
        except (OSError, ValueError, KeyError):
            continue
    return out


def submit(url: str, *args: str) -> int:
    out = cli(url, "submit", "--team", "ml", "--json", *args)
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["id"])


def show(url: str, job_id: int) -> dict[str, Any]:
    out = cli(url, "show", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    job: dict[str, Any] = json.loads(out.stdout)
    return job


def assert_resumed_result(log: str, steps: int) -> None:
    """The counter's last line: the right sum, from an attempt that resumed."""
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) > 0


def where(log: str) -> tuple[str, list[int]]:
    """Where the last attempt ran (an online job of the team may have displaced one)."""
    line = [x for x in log.splitlines() if x.startswith("where ")][-1]
    _, node, visible = line.split()
    return node, sorted(int(x) for x in visible.split(","))


def _cluster_nodes(url: str) -> list[dict[str, Any]] | None:
    """GET /v1/cluster's nodes, or None while the view is not to be had: a view waits 5 s
    for the loop's state and then answers 503, and the loop's first cycles on a loaded host
    (reading every node's telemetry actor) took longer than the client's 5 s once."""
    try:
        r = HTTP.get(f"{url}/v1/cluster", timeout=15)
    except httpx.TimeoutException:
        return None
    return list(r.json()["nodes"]) if r.status_code == 200 else None


def test_the_fleet_and_its_telemetry_come_from_the_ray_nodes(server: Server) -> None:
    assert "node a1: 4xA100-80GB, site" in server.log.read_text()
    wait_for(lambda: _cluster_nodes(server.url) is not None, 60, "the cluster view")
    nodes = {n["name"]: n for n in _cluster_nodes(server.url) or []}
    assert {k: (n["gpu_model"], n["state"]) for k, n in nodes.items()} == {
        "a1": ("A100-80GB", "up"),
        "a2": ("A100-80GB", "up"),
        "h1": ("H100-80GB", "up"),
    }
    # read on each node by its telemetry actor (a fake fleet: this machine has no GPU)
    wait_for(
        lambda: all(
            g["util_pct"] is not None
            for n in _cluster_nodes(server.url) or [{"gpus": [{"util_pct": None}]}]
            for g in n["gpus"]
        ),
        60,
        "telemetry samples from every node",
    )
    uuids = [g["uuid"] for n in nodes.values() for g in n["gpus"]]
    assert len(set(uuids)) == 12


def test_jobs_run_where_the_core_placed_them_and_logs_stream(
    server: Server, tmp_path: Path
) -> None:
    url = server.url
    done = tmp_path / "done"
    jobs = [
        submit(url, "--kind", "training", "--gpus", "2", "--", PY, "-c", UNTIL, str(done)),
        submit(url, "--kind", "offline-inference", "--gpus", "1", "--", PY, "-c", WHERE, "5"),
        submit(url, "--kind", "online-inference", "--gpus", "3", "--", PY, "-c", WHERE, "5"),
        submit(url, "--gpu-model", "H100-80GB", "--gpus", "4", "--", PY, "-c", WHERE, "5"),
    ]
    # the long one is read while it runs: through its actor, on its node
    wait_for(lambda: show(url, jobs[0])["state"] == "running", 60, "the first job to run")
    wait_for(lambda: "tick 3" in cli(url, "logs", str(jobs[0])).stdout, 30, "streamed output")
    assert show(url, jobs[0])["state"] == "running"
    done.touch()
    for j in jobs:
        wait_for(lambda j=j: show(url, j)["state"] == "succeeded", 90, f"job {j} to finish")
        job = show(url, j)
        chosen = {(g["node"], g["index"]) for g in job["gpus"]}
        node, visible = where(cli(url, "logs", str(j)).stdout)
        assert {n for n, _ in chosen} == {node}
        assert visible == sorted(g for _, g in chosen)
    assert where(cli(url, "logs", str(jobs[3])).stdout)[0] == "h1"


def test_a_preempted_training_job_resumes_on_another_node_with_its_progress(
    server: Server, tmp_path: Path
) -> None:
    url = server.url
    steps = 150
    done = tmp_path / "blocker-done"
    blocker = submit(
        url, "--gpu-model", "A100-80GB", "--gpus", "4", "--", PY, "-c", UNTIL, str(done)
    )
    wait_for(lambda: show(url, blocker)["state"] == "running", 60, "the blocker to run")
    train = submit(
        url,
        "--kind",
        "training",
        "--priority",
        "low",
        "--gpu-model",
        "A100-80GB",
        "--gpus",
        "4",
        "--checkpoint-every",
        "1s",
        "--grace",
        "20s",
        "--",
        *paced_counter(steps, 0.3),
    )
    wait_for(lambda: "step=10" in cli(url, "logs", str(train)).stdout, 60, "training progress")
    (first,) = {g["node"] for g in show(url, train)["gpus"]}
    (held,) = {g["node"] for g in show(url, blocker)["gpus"]}
    assert {first, held} == {"a1", "a2"}
    out = cli(
        url, "submit", "--team", "serving", "--kind", "online-inference", "--gpu-model",
        "A100-80GB", "--json", "--", PY, "-c", UNTIL, str(tmp_path / "online-done"),
    )  # fmt: skip
    online = int(json.loads(out.stdout)["id"])
    wait_for(lambda: show(url, train)["state"] == "suspended", 120, "the training to yield")
    wait_for(lambda: show(url, online)["state"] != "pending", 30, "the online job to start")
    assert {g["node"] for g in show(url, online)["gpus"]} == {first}
    done.touch()  # the blocker ends: its node is the only one with room for 4 GPUs
    wait_for(lambda: show(url, train)["state"] == "succeeded", 120, "the training to finish")
    job = show(url, train)
    assert {g["node"] for g in job["gpus"]} == {held} != {first}
    assert job["attempts"] == 2 and job["preemptions"] == 1
    log = cli(url, "logs", str(train)).stdout
    assert "SIGTERM: checkpoint saved" in log
    assert_resumed_result(log, steps)
    (tmp_path / "online-done").touch()
    wait_for(lambda: show(url, online)["state"] == "succeeded", 30, "the online job")


def test_a_killed_node_is_in_the_events_and_metrics_and_its_job_finishes_elsewhere(
    server: Server, ray_cluster: Any
) -> None:
    url = server.url
    steps = 200
    # The first attempt is slow (60 s) so it cannot finish before a loaded host notices the
    # loss (it once did, at 6 s); the resumed attempt is fast. The sum does not depend on it.
    victim = submit(
        url,
        "--kind",
        "training",
        "--gpus",
        "3",
        "--gpu-model",
        "A100-80GB",
        "--checkpoint-every",
        "1s",
        "--",
        *paced_counter(steps, 0.3),
    )
    wait_for(lambda: show(url, victim)["state"] == "running", 60, "the victim to run")
    (node,) = {g["node"] for g in show(url, victim)["gpus"]}
    wait_for(lambda: "step=20" in cli(url, "logs", str(victim)).stdout, 30, "progress")
    ray_cluster.cluster.remove_node(ray_cluster.nodes[node], allow_graceful=False)

    def metric(line: str) -> bool:
        return line in HTTP.get(f"{url}/metrics").text

    wait_for(
        lambda: metric(f'gpupool_node_lost_total{{node="{node}"}} 1.0'), 60, "the node-lost metric"
    )
    up = [
        x
        for x in HTTP.get(f"{url}/metrics").text.splitlines()
        if x.startswith(f'gpupool_node_up{{node="{node}",')
    ]
    assert len(up) == 1 and up[0].endswith('state="lost"} 0.0'), up
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    lost = [e for e in events if e["kind"] == "node-lost"]
    assert lost and node in lost[0]["message"], events[-10:]
    wait_for(lambda: show(url, victim)["state"] == "succeeded", 120, "the victim to finish")
    job = show(url, victim)
    assert job["attempts"] >= 2 and {g["node"] for g in job["gpus"]} != {node}
    assert_resumed_result(cli(url, "logs", str(victim)).stdout, steps)


PRICED_AND_LEARNED = """\
teams: [{name: ml}]
online_reserve: 0
energy: {tariff: guangdong-tou, price_aware: true, deferral_slot_min: 1}
policy: learned
learning:
  mode: shadow
  rule: las
  predictor: recent-median
  guard: {window_jobs: 10, min_finished: 10, cold_start_s: 0}
"""


def _utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_price_aware_deferral_and_the_learned_policy_in_shadow_on_ray(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """`gpupool serve --ray` with a tariff and the learned policy in shadow, its clock at
    23:58 running 20x: a 10-minute job due at 04:00 waits for the valley from 00:00 (6 s
    later), then starts on a Ray node before its deadline; `gpupool learn status` shows the
    learned policy in shadow over 2D-LAS, having seen every job submitted (cold: too few
    have ended for its model to train)."""
    (tmp_path / "serve.yaml").write_text(PRICED_AND_LEARNED, encoding="utf-8")
    srv = Server(
        tmp_path / "state", "--config", str(tmp_path / "serve.yaml"),
        "--ray", ray_cluster.cluster.address, "--ray-namespace", "gpupool-priced",
        "--auth", "none", "--cycle", "0.2",
        "--clock-start", "2037-12-01T23:45:00", "--clock-speed", "60",
    ).start(timeout_s=120)  # fmt: skip
    try:
        url = srv.url
        quick = [submit(url, "--gpus", "1", "--", "sleep", "0.5") for _ in range(3)]
        deadline = _utc("2037-12-02T04:00:00")
        job = submit(url, "--gpus", "1", "--duration", "10m", "--deadline", f"{deadline:.0f}",
                     "--", "sleep", "0.5")  # fmt: skip
        seen: list[dict[str, Any]] = []

        def deferred() -> bool:
            seen.append(show(url, job))
            return seen[-1]["state"] == "pending" and "deferred until 00:00" in seen[-1]["reason"]

        wait_for(deferred, 20, "the deferral")
        assert str(seen[-1]["reason"]).endswith("(price)"), seen[-1]
        wait_for(lambda: show(url, job)["state"] == "succeeded", 60, "the start in the cheap hour")
        ran = show(url, job)
        assert _utc("2037-12-02T00:00:00") <= float(ran["started_at"]) <= deadline - 600
        assert ran["gpus"][0]["node"] in ray_cluster.layout, ran
        wait_for(lambda: all(show(url, j)["state"] == "succeeded" for j in quick), 60, "the rest")
        out = cli(url, "learn", "status", "--days", "1", "--json", timeout_s=120)
        assert out.returncode == 0, out.stderr
        said = json.loads(out.stdout)
        status = said["status"]  # the learner saw every submission; too few ended to train
        assert said["mode"] == "shadow" and status["rule"] == "las", said
        assert status["submits_seen"] == 4 and status["guard"] == "cold", status
    finally:
        srv.stop()


STARTS = """\
import os, sys, time
line = f"start {os.environ['GPUPOOL_JOB_ID']} {os.environ['GPUPOOL_ATTEMPT']}\\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
time.sleep(float(sys.argv[2]))
"""


def test_a_standby_on_postgresql_takes_over_the_ray_cluster(
    ray_cluster: Any,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two `gpupool serve --ray` on one PostgreSQL database and one Ray cluster: the second
    stands by (and joins no Ray cluster) until the first is SIGKILLed, then takes over: the
    jobs the first started are adopted where they run, none starts twice, the queue runs on."""
    state = tmp_path / "state"
    starts = tmp_path / "starts.log"
    script = tmp_path / "job.py"
    script.write_text(STARTS)
    args = ("--db", fresh_schema(pg_url), "--ray", ray_cluster.cluster.address)
    args += ("--ray-namespace", "gpupool-standby", "--auth", "none", "--cycle", "0.2")
    first = Server(state, *args).start(timeout_s=120)
    second = Server(state, *args).start(timeout_s=120)
    try:
        assert HTTP.get(f"{second.url}/healthz", timeout=5).json()["role"] == "standby"
        assert HTTP.get(f"{first.url}/healthz", timeout=5).json()["role"] == "active"
        ids = []
        for k in range(8):  # 4 run long enough to be adopted, 4 wait on them or run after
            body = {
                "command": [PY, str(script), str(starts), "12" if k < 4 else "1"],
                "team": "ml", "name": f"j{k}", "gpus": 2, "gpu_model": "A100-80GB",
            }  # fmt: skip
            r = HTTP.post(f"{first.url}/v1/jobs", json=body, timeout=10)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        def started() -> set[str]:
            text = starts.read_text() if starts.exists() else ""
            return {line.split()[1] for line in text.splitlines()}

        wait_for(lambda: len(started()) >= 2, 60, "jobs to start on the first server")
        first.kill()
        killed_at = time.monotonic()
        wait_for(
            lambda: HTTP.get(f"{second.url}/healthz", timeout=5).json()["role"] == "active",
            60,
            "the standby to take over",
        )
        print(f"the standby took over in {time.monotonic() - killed_at:.1f} s")

        def states() -> list[str]:
            jobs = HTTP.get(f"{second.url}/v1/jobs", timeout=5).json()["jobs"]
            return [j["state"] for j in jobs]

        wait_for(lambda: states().count("succeeded") == len(ids), 120, "every job to end")
        lines = starts.read_text().splitlines()
        assert sorted(line.split()[1] for line in lines) == sorted(map(str, ids)), lines
        assert all(line.split()[2] == "1" for line in lines), lines  # none started twice
        events = HTTP.get(f"{second.url}/v1/events", params={"after": 0}).json()["events"]
        assert any(e["kind"] == "adopted" for e in events), [e["kind"] for e in events]
    finally:
        second.stop()
        first.stop()
