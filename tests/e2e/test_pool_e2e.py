"""The live end-to-end tests on both executors: one fixture, `pool`, parametrised `local`
(one `gpupool serve`, its in-process agent) and `ray` (a Ray head, two machines joined with
`gpupool node join` on 127.0.0.2 and 127.0.0.3 with their own node directories,
`gpupool serve --ray`); both as root with isolation on and checkpoints in shared storage
(tests/support/pools.py). The tests marked for `ray` alone are what one machine cannot
show: a node killed with its disk, a node drained by SIGTERM, the nodes' agents. The `ray`
ones are marked `ray_cluster`: `make test` runs them beside the main suite in a
loopback-only network namespace, with tests/ray; the `local` ones in the main suite."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import chromium
from gpupool.examples.ckpt_counter import expected_result
from launch_kills import sigkills_around_launches
from pools import RACKS, STATE_DISK_MIB, SYSTEM_PY, Pool, fill, local_pool, ray_pool
from service_proc import HTTP, cli, wait_for

RAY = pytest.param("ray", marks=pytest.mark.ray_cluster)
RAY_ONLY = pytest.mark.parametrize("pool", [RAY], indirect=True)


@pytest.fixture(scope="module", params=["local", RAY])
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    with local_pool() if request.param == "local" else ray_pool() as made:
        yield made


def submit(url: str, team: str, *args: str) -> int:
    out = cli(url, "submit", "--team", team, "--json", *args)
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["id"])


def show(url: str, job_id: int) -> dict[str, Any]:
    """The job as `gpupool show ID --json` prints it (the server's JSON), read over HTTP:
    the tests poll it, and a command is a process a poll need not start."""
    got = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10)
    assert got.status_code == 200, got.text
    job: dict[str, Any] = got.json()
    return job


def nodes_of(url: str, job_id: int) -> set[str]:
    return {g["node"] for g in show(url, job_id)["gpus"]}


def submit_counter(pool: Pool, steps: int, gpus: int, every: int, *flags: str) -> int:
    """Team a's checkpointing counter (training): 0.3 s a step on its first attempt, so a
    loaded host cannot see it finish before the test stops it, 0.01 s once resumed."""
    pace = 'if [ -n "$GPUPOOL_RESUME" ]; then p=0.01; else p=0.3; fi'
    run = f'{pace}; exec {SYSTEM_PY} {pool.counter} --steps {steps} --step-s "$p" --every {every}'
    return submit(
        pool.url, "ctest-a", "--kind", "training", "--gpus", str(gpus), *flags,
        "--", "sh", "-c", run,
    )  # fmt: skip


def result_of(log: str) -> dict[str, str]:
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    return dict(kv.split("=") for kv in last.split())


CHECKPOINT_THEN_WAIT = """\
import os, subprocess, sys, time
open(os.path.join(os.environ['GPUPOOL_CHECKPOINT_DIR'], 'secret'), 'w').write('team a')
print('user', subprocess.run(['id', '-un'], capture_output=True, text=True).stdout.strip())
print('node', os.environ.get('GPUPOOL_NODE', '-'), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""

HOSTILE = """\
import json, os, signal, subprocess, sys
a_ckpt, a_pid, escape_s, a_logs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
tried = {}
try:
    open(os.path.join(a_ckpt, 'secret')).read(); tried['read checkpoint'] = 'allowed'
except OSError:
    tried['read checkpoint'] = 'denied'
for k, log in enumerate(a_logs):
    try:
        open(log).read(); tried[f'read log {k}'] = 'allowed'
    except OSError:
        tried[f'read log {k}'] = 'denied'
try:
    os.kill(a_pid, signal.SIGTERM); tried['signal'] = 'allowed'
except OSError:
    tried['signal'] = 'denied'
forked = 0
children = []
try:
    for _ in range(200):
        children.append(subprocess.Popen(['sleep', '30'])); forked += 1
except OSError:
    pass
for c in children:
    c.kill(); c.wait()
tried['forked'] = forked
# an escaped child: its own session, still running when the job ends
subprocess.Popen(['setsid', 'sleep', escape_s], start_new_session=True)
print(json.dumps({'tried': tried, 'user': os.environ.get('USER')}), flush=True)
"""


def _process_running(argv: list[str]) -> bool:
    want = "\0".join(argv).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == want:
                return True
    return False


def _pid_of(marker: str) -> int:
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
            if cmd.startswith(SYSTEM_PY.encode()) and marker.encode() in cmd:
                return int(p)
    raise AssertionError(f"no process runs {marker}")


def test_jobs_run_contained_as_their_teams(pool: Pool) -> None:
    """Team b cannot read team a's checkpoint or logs, or signal its processes; `id -un`
    in a job is its team's user; a pids limit stops a fork loop; an escaped child is
    killed with its job, before the job counts as ended."""
    url = pool.url
    release = pool.root / "release-a"
    a = submit(
        url, "ctest-a", "--kind", "training", "--gpus", "2", "--",
        SYSTEM_PY, "-c", CHECKPOINT_THEN_WAIT, str(release),
    )  # fmt: skip
    wait_for(lambda: "node " in cli(url, "logs", str(a)).stdout, 90, "team a's job")
    log_a = cli(url, "logs", str(a)).stdout
    assert "user gpupool-ctest-a" in log_a
    (node_a,) = nodes_of(url, a)
    if pool.kind == "ray":
        assert f"node {node_a}" in log_a  # it ran on the node the core chose
    ckpt_a = pool.shared / "checkpoints" / str(a)
    secret = ckpt_a / "secret"  # in the shared storage, the team's alone
    assert secret.stat().st_uid == pwd.getpwnam("gpupool-ctest-a").pw_uid
    a_pid = _pid_of(str(release))
    logs = [str(p) for p in pool.log_copies(a, node_a)]
    assert all(Path(p).is_file() for p in logs)
    escape_s = str(300 + zlib.crc32(str(pool.root).encode()) % 1000)  # this pool's alone
    b = submit(
        url, "ctest-b", "--kind", "batch", "--gpus", "1", "--",
        SYSTEM_PY, "-c", HOSTILE, str(ckpt_a), str(a_pid), escape_s, *logs,
    )  # fmt: skip
    wait_for(lambda: show(url, b)["state"] in ("succeeded", "failed"), 90, "team b's job")
    assert show(url, b)["state"] == "succeeded", cli(url, "logs", str(b)).stdout
    seen = json.loads(cli(url, "logs", str(b)).stdout.strip().splitlines()[-1])
    assert seen["user"] == "gpupool-ctest-b"
    tried = seen["tried"]
    assert {k: v for k, v in tried.items() if k != "forked"} == {
        "read checkpoint": "denied",
        "signal": "denied",
        **{f"read log {k}": "denied" for k in range(len(logs))},
    }
    assert 0 < tried["forked"] < 48  # the pids limit of batch jobs stopped the fork loop
    # the escaped `setsid sleep` was killed with its job, before the job was "ended"
    assert not _process_running(["sleep", escape_s])
    shown = cli(url, "show", str(a), "--json")
    assert shown.returncode == 0, shown.stderr
    said, read = json.loads(shown.stdout), show(url, a)
    assert [said[k] for k in ("id", "state", "gpus")] == [read[k] for k in ("id", "state", "gpus")]
    assert show(url, a)["state"] == "running"
    release.touch()
    wait_for(lambda: show(url, a)["state"] == "succeeded", 60, "team a's job to finish")


def test_windows_holds_drains_and_their_reasons_in_why_the_dashboard_and_the_review(
    pool: Pool,
) -> None:
    """Team ctest-shift's time window (now, 1 GPU of 4) keeps its second job waiting with
    `Window`; a hold shows `Held`; the node of its first job drained (`gpupool nodes`:
    draining, then drained) takes no new job: released, the second job runs elsewhere on
    Ray and waits with `Resources` on the one local node until the drain is undone. The
    dashboard in Chromium shows the nodes, the window and the queue's reason; the monthly
    review reads the run back from the server's database."""
    url = pool.url
    release = pool.root / "release-shift"
    wait_cmd = f'i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done'
    first = submit(url, "ctest-shift", "--kind", "batch", "--gpus", "1", "--", "sh", "-c", wait_cmd)
    wait_for(lambda: show(url, first)["state"] == "running", 90, "the shift's first job")
    second = submit(url, "ctest-shift", "--kind", "batch", "--gpus", "1", "--", "true")

    def why(job_id: int) -> dict[str, Any]:
        out = cli(url, "why", str(job_id), "--json")
        assert out.returncode == 0, out.stderr
        said: dict[str, Any] = json.loads(out.stdout)
        return said

    wait_for(lambda: why(second)["reason_code"] == "Window", 30, "the window's reason")
    assert "time window caps it" in why(second)["reason"], why(second)
    assert cli(url, "hold", str(second)).returncode == 0
    wait_for(lambda: why(second)["reason_code"] == "Held", 30, "the hold's reason")

    (drained,) = nodes_of(url, first)
    out = cli(url, "drain", drained, "--reason", "cabling")
    assert out.returncode == 0, out.stderr
    assert pool.node_states()[drained]["state"] == "draining"
    with chromium() as browser:  # the dashboard: the nodes, the window, the queue
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/")
        for name in pool.node_states():
            page.wait_for_selector(f'[data-node="{name}"]', timeout=15_000)
        row = page.locator(f'#panel-queue tr[data-job="{second}"]')
        row.wait_for(timeout=15_000)
        assert "Held" in row.inner_text(), row.inner_text()
        window = page.locator("#active-window").inner_text(timeout=15_000)
        assert "Active window" in window and "ctest-shift" in window, window
    release.touch()
    wait_for(lambda: show(url, first)["state"] == "succeeded", 60, "the first job to end")
    wait_for(lambda: pool.node_states()[drained]["state"] == "drained", 30, "drained")
    assert cli(url, "release", str(second)).returncode == 0
    if pool.kind == "local":  # one node, drained: the job waits for it
        wait_for(lambda: why(second)["reason_code"] == "Resources", 30, "no node for it")
        assert show(url, second)["state"] == "pending"
        assert cli(url, "drain", drained, "--undo").returncode == 0
    wait_for(lambda: show(url, second)["state"] == "succeeded", 60, "the second job")
    if pool.kind == "ray":
        assert nodes_of(url, second) != {drained}
        assert cli(url, "drain", drained, "--undo").returncode == 0
    wait_for(lambda: pool.node_states()[drained]["state"] == "up", 30, "the drain undone")
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    drains = [(e["kind"], e["message"]) for e in events if e["kind"].startswith("node-")]
    assert ("node-drain", "cabling") in drains and drains[-1][0] == "node-undrain", drains

    html = pool.root / "review.html"  # the review, from the live database
    db = f"sqlite:///{pool.state / 'gpupool.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "report", "--db", db, "--html", str(html)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = html.read_text()
    assert "ctest-shift" in text and drained in text


def test_sigkills_in_launch_windows_never_run_a_job_twice(pool: Pool) -> None:
    """20 SIGKILLs of a scheduler (tests/support/service_zygote.py: the local executor, or
    the Ray executor on the joined nodes), half of them aimed just after a launch intent
    appears: no job ever runs twice (each flocks a marker in shared storage)."""
    base = pool.root / "kills"
    (base / "state").mkdir(parents=True, mode=0o711)
    url = f"sqlite:///{base / 'state' / 'gpupool.db'}"
    ray = pool.kind == "ray"
    seen = sigkills_around_launches(
        base, url, kills=20, seed=20261206, ray_address=pool.head,
        window_s=0.05 if ray else 0.03, end_s=180.0, intent_wait_s=30.0 if ray else 3.0,
    )  # fmt: skip
    print(pool.kind, seen)
    assert seen["kills"] >= 20 and seen["jobs"] >= 20 and seen["starts"] >= seen["jobs"]
    assert seen["lost"] + seen["adopted_by_intent"] > 0  # some kills did land in a launch


def test_a_crash_looping_service_backs_off(pool: Pool) -> None:
    made = cli(pool.url, "service", "create", "crashy", "--team", "web", "--", "false")
    assert made.returncode == 0, made.stderr

    def replicas() -> list[dict[str, Any]]:
        jobs = HTTP.get(f"{pool.url}/v1/jobs", params={"limit": 1000}, timeout=5).json()
        return [j for j in jobs["jobs"] if j.get("service") == "crashy"]

    wait_for(lambda: any(j["state"] == "failed" for j in replicas()), 60, "a failure")
    wait_for(
        lambda: "backing off:" in cli(pool.url, "service", "show", "crashy").stdout,
        30,
        "the backoff in `service show`",
    )
    first = len(replicas())
    time.sleep(4.0)  # 20 cycles: without the backoff, a replica (and a job row) each
    assert len(replicas()) <= first + 2, [(j["id"], j["state"]) for j in replicas()]
    assert cli(pool.url, "service", "delete", "crashy").returncode == 0


@RAY_ONLY
def test_joined_machines_are_the_pool(pool: Pool) -> None:
    wait_for(
        lambda: all(n["agent"]["where"] != "no answer" for n in pool.node_states().values()),
        30,
        "every node's agent to answer",
    )
    nodes = pool.node_states()
    assert {k: (n["gpu_model"], len(n["gpus"]), n["state"]) for k, n in nodes.items()} == {
        "n1": ("A100-80GB", 2, "up"),
        "n2": ("A100-80GB", 2, "up"),
    }
    for name, n in nodes.items():  # each node's agent answers and reaches the storage
        assert n["agent"]["where"].startswith("launcher pid"), n["agent"]
        assert n["agent"]["storage"] == "ok" and not n["agent"]["leaving"]
        assert n["agent"]["dir"] == str(pool.nodes[name].node_dir / "agent")
    assert "launcher pid" in cli(pool.url, "nodes").stdout
    for node in pool.nodes.values():
        record = json.loads((node.node_dir / "node.json").read_text())
        assert record["node_ip"] == node.ip and record["labels"] == {"rack": RACKS[node.name]}
        assert (node.node_dir / "ray").is_dir()  # Ray's own files stay in the node dir
    # the labels reach the server: a gang that requires a rack waits (n1 and n2 are in
    # racks of their own) and says why, rather than spread over the two
    labels = {n["name"]: n["labels"] for n in HTTP.get(f"{pool.url}/v1/cluster").json()["nodes"]}
    assert labels == {"n1": {"rack": "r1"}, "n2": {"rack": "r2"}}, labels
    gang = submit(pool.url, "ctest-b", "--gpus", "4", "--topology", "rack", "--", "true")
    wait_for(lambda: "inside one rack" in cli(pool.url, "why", str(gang)).stdout, 30, "the reason")
    assert show(pool.url, gang)["state"] == "pending"
    assert cli(pool.url, "cancel", str(gang)).returncode == 0


def _back_in_the_pool(pool: Pool, name: str) -> None:
    wait_for(lambda: pool.node_states()[name]["state"] == "up", 120, f"node {name} back")


@RAY_ONLY
def test_a_killed_node_loses_nothing_its_checkpointing_job_needs(pool: Pool) -> None:
    """The node's process group SIGKILLed and its node directory deleted: its job resumes
    on the other node from its last checkpoint, and the first attempt's output is kept."""
    url = pool.url
    steps = 200
    job = submit_counter(pool, steps, 2, 5, "--checkpoint-every", "1s")
    wait_for(lambda: "step=20" in cli(url, "logs", str(job)).stdout, 90, "progress")
    (victim,) = nodes_of(url, job)
    node = pool.nodes[victim]
    assert (pool.shared / "checkpoints" / str(job) / "counter.json").is_file()
    assert (node.node_dir / "runs" / str(job) / "stdout.log").is_file()  # the logs are not
    assert "step=20" in (pool.state / "jobs" / str(job) / "stdout.log").read_text()
    os.killpg(node.proc.pid, signal.SIGKILL)  # the machine dies
    node.proc.wait(10)
    shutil.rmtree(node.node_dir)  # and its disk with it
    wait_for(lambda: show(url, job)["state"] == "succeeded", 180, "the job to finish elsewhere")
    assert show(url, job)["attempts"] >= 2 and nodes_of(url, job) != {victim}
    log = cli(url, "logs", str(job)).stdout
    assert "== attempt 1 ==" in log and "step=20" in log  # the first attempt's output
    fields = result_of(log)
    assert int(fields["result"]) == expected_result(steps) and int(fields["resumed_from"]) > 0
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    assert any(e["kind"] == "node-lost" and victim in e["message"] for e in events)
    pool.join(victim)  # the machine comes back: it joins the pool again
    _back_in_the_pool(pool, victim)


@RAY_ONLY
def test_a_node_stopped_with_sigterm_drains_its_job_to_the_other(pool: Pool) -> None:
    url = pool.url
    steps = 200
    job = submit_counter(pool, steps, 2, 10, "--grace", "20s")
    wait_for(lambda: "step=10 " in cli(url, "logs", str(job)).stdout, 90, "progress")
    (leaving,) = nodes_of(url, job)
    node = pool.nodes[leaving]
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(90) == 0, node.log.read_text()[-2000:]
    assert "left the cluster" in node.log.read_text()
    wait_for(lambda: show(url, job)["state"] == "succeeded", 120, "the job to finish elsewhere")
    assert nodes_of(url, job) != {leaving}
    log = cli(url, "logs", str(job)).stdout
    assert "SIGTERM: checkpoint saved" in log  # it left with its grace, not killed
    assert int(result_of(log)["result"]) == expected_result(steps)
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    assert any("is leaving" in e["message"] for e in events), events[-10:]
    pool.join(leaving)
    _back_in_the_pool(pool, leaving)


@RAY_ONLY
def test_join_refuses_a_second_agent_on_one_node_dir_and_bad_labels(pool: Pool) -> None:
    busy = next(n for n in pool.nodes.values() if n.proc.poll() is None)
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "node", "join", pool.head, "--name", "dup",
         "--node-dir", str(busy.node_dir), "--fake-gpus", "1xA100-80GB"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "another `gpupool node join`" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "node", "join", pool.head, "--label", "rack r1",
         "--fake-gpus", "1xA100-80GB", "--node-dir", str(pool.root / "x")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "KEY=VALUE" in out.stderr


def _fault(url: str, **body: Any) -> dict[str, Any]:
    r = HTTP.post(f"{url}/v1/admin/fake-faults", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_failed_gpu_is_drained_and_its_job_resumes_elsewhere(pool: Pool) -> None:
    """XID 79 on the GPU of a checkpointing job: that card alone is drained with the
    reason, the job leaves with a checkpoint and resumes on another GPU from it."""
    url = pool.url
    steps = 150
    job = submit_counter(pool, steps, 1, 5, "--grace", "20s", "--checkpoint-every", "1s")
    wait_for(lambda: "step=10" in cli(url, "logs", str(job)).stdout, 90, "progress")
    (first,) = show(url, job)["gpus"]
    done = _fault(url, gpu=first["index"], node=first["node"], fault="xid", xid=79)
    assert done["done"] == "XID 79"
    wait_for(lambda: show(url, job)["state"] == "succeeded", 120, "the job to finish elsewhere")
    (again,) = show(url, job)["gpus"]
    assert (again["node"], again["index"]) != (first["node"], first["index"])
    assert show(url, job)["attempts"] == 2
    log = cli(url, "logs", str(job)).stdout
    assert "SIGTERM: checkpoint saved" in log
    fields = result_of(log)
    assert int(fields["result"]) == expected_result(steps) and int(fields["resumed_from"]) > 0
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    unhealthy = [e["message"] for e in events if e["kind"] == "gpu-unhealthy"]
    assert any("XID 79" in m and first["node"] in m for m in unhealthy), unhealthy
    out = [o for n in pool.node_states().values() for o in n["gpus_out"]]
    assert len(out) == 1 and "XID 79" in out[0]["reason"], out
    _fault(url, gpu=first["index"], node=first["node"], fault="repair")
    wait_for(lambda: not any(n["gpus_out"] for n in pool.node_states().values()), 30, "the repair")


def test_a_power_cap_is_applied_and_reset_on_the_right_node(pool: Pool) -> None:
    """Offline inference is memory-bound: its GPU's SM clock is locked while it runs, on
    its own node (no other card changes), and unlocked once it has ended."""
    url = pool.url
    release = pool.root / "release-offline"
    job = submit(
        url, "ctest-a", "--kind", "offline-inference", "--gpus", "1", "--",
        "sh", "-c", f'i=0; while [ ! -e "{release}" ] && [ $i -lt 600 ]; do sleep 0.1; '
        "i=$((i+1)); done",
    )  # fmt: skip
    wait_for(lambda: show(url, job)["state"] == "running", 90, "the job to run")
    (gpu,) = show(url, job)["gpus"]

    def clocks() -> dict[tuple[str, int], int]:
        nodes = HTTP.get(f"{url}/v1/cluster", timeout=10).json()["nodes"]
        return {
            (n["name"], g["index"]): int(g["sm_clock_mhz"] or 0) for n in nodes for g in n["gpus"]
        }

    top = 1980
    here = (gpu["node"], gpu["index"])
    wait_for(lambda: clocks()[here] < top, 30, "the clock lock")
    assert all(mhz == top for key, mhz in clocks().items() if key != here), clocks()
    release.touch()
    wait_for(lambda: show(url, job)["state"] == "succeeded", 60, "the job to end")
    wait_for(lambda: clocks()[here] == top, 30, "the reset")
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    caps = [e["message"] for e in events if e["kind"] == "power-cap"]
    assert len(caps) >= 2 and "applied" in caps[0] and "job left" in caps[-1], caps


def test_an_elastic_job_lends_a_gpu_to_an_online_peak_and_gets_it_back(pool: Pool) -> None:
    """An elastic offline job (1..2 GPUs) beside a 2-GPU blocker: an online job finds no
    free GPU, the elastic job shrinks to 1 (checkpoints, restarts), the online job runs on
    the GPU it gave up, and it grows back to 2 once the peak has passed; it stays
    `running` throughout and the items it has processed never go back."""
    url = pool.url
    release = pool.root / "release-blocker"
    blocker = submit(
        url, "ctest-b", "--kind", "training", "--gpus", "2", "--",
        "sh", "-c", f'i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; do sleep 0.1; '
        "i=$((i+1)); done",
    )  # fmt: skip
    counter = f"exec {SYSTEM_PY} {pool.counter} --steps 100000 --step-s 0.02 --every 5"
    elastic = submit(
        url, "ctest-a", "--kind", "offline-inference", "--gpus", "1..2", "--grace", "20s",
        "--", "sh", "-c", counter,
    )  # fmt: skip
    ckpt = pool.shared / "checkpoints" / str(elastic) / "counter.json"

    def processed() -> int:
        try:
            return int(json.loads(ckpt.read_text())["step"])
        except (OSError, ValueError, KeyError):
            return 0

    wait_for(
        lambda: len(show(url, elastic)["gpus"]) == 2 and processed() > 0
        and show(url, blocker)["state"] == "running",
        90,
        "the elastic job on 2 GPUs beside the blocker",
    )  # fmt: skip
    online = submit(
        url, "web", "--kind", "online-inference", "--gpus", "1", "--",
        "sh", "-c", "sleep 8; echo served",
    )  # fmt: skip
    counts: list[int] = []
    last, beside = 0, False
    deadline = time.monotonic() + 120
    for _ in range(3000):  # bounded: at most 120 s of polls
        if time.monotonic() > deadline:
            break
        job = show(url, elastic)
        assert job["state"] == "running", job
        done = processed()
        assert done >= last, f"processed items went back: {last} -> {done}"
        last = done
        if not counts or counts[-1] != len(job["gpus"]):
            counts.append(len(job["gpus"]))
        state = show(url, online)["state"]
        beside = beside or (len(job["gpus"]) == 1 and state == "running")
        if state == "succeeded" and counts[-1] == 2 and 1 in counts:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"polled too long: GPU counts {counts}")
    assert beside and 1 in counts and counts[-1] == 2, counts
    release.touch()
    assert cli(url, "cancel", str(elastic)).returncode == 0
    wait_for(lambda: show(url, blocker)["state"] == "succeeded", 60, "the blocker to end")


def test_a_service_scales_out_from_measured_load(pool: Pool) -> None:
    """A service of 1..3 replicas under 40 rps of real HTTP load (gpupool loadgen): the
    scraper measures the load at each replica's node address, and the service scales out;
    on Ray, with a GPU of the first replica's node taken meanwhile, the next replica runs
    on the other node and is reached there."""
    url = pool.url
    made = cli(
        url, "service", "create", "chat", "--team", "web", "--replicas", "1..3",
        "--replica-rps", "10", "--slo-p99-ms", "500", "--grace", "5", "--",
        SYSTEM_PY, str(pool.replica), "--slots", "2", "--ms", "20",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr

    def replicas() -> list[dict[str, Any]]:
        view = HTTP.get(f"{url}/v1/services/chat", timeout=10).json()
        return [r for r in view["replicas"] if r["ready"]]

    wait_for(lambda: len(replicas()) == 1, 90, "the first replica to serve")
    (first,) = replicas()
    release = pool.root / "release-beside"
    beside = submit(
        url, "ctest-b", "--kind", "batch", "--gpus", "1", "--",
        "sh", "-c", f'i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; do sleep 0.1; '
        "i=$((i+1)); done",
    )  # fmt: skip
    wait_for(lambda: show(url, beside)["state"] == "running", 60, "the job beside it")
    if pool.kind == "ray":  # best fit: it took the first replica's node's other GPU
        assert nodes_of(url, beside) == {first["node"]}
    load = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "loadgen", "--service", "chat", "--rps", "40",
         "--duration-s", "40", "--url", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: len(replicas()) >= 2, 60, "the service to scale out")
    finally:
        load.kill()
        load.wait(10)
    ready = replicas()
    for r in ready:
        host = r["url"].split("//")[1].split(":")[0]
        assert host == r["address"]
        if pool.kind == "ray":
            assert host == pool.nodes[r["node"]].ip  # reached at its own node's address
        assert HTTP.get(f"{r['url']}/metrics", timeout=5).status_code == 200
    if pool.kind == "ray":
        assert {r["node"] for r in ready} == set(pool.nodes)  # replicas on both nodes
    shown = cli(url, "service", "show", "chat").stdout
    assert all(r["url"] in shown for r in ready), shown
    release.touch()
    assert cli(url, "service", "delete", "chat").returncode == 0
    wait_for(lambda: show(url, beside)["state"] == "succeeded", 60, "the job beside it")


def test_a_submit_on_a_full_disk_is_refused_with_the_reason(pool: Pool) -> None:
    """The server's state disk full: `gpupool submit` is refused (507) with what to do,
    never a 500, the server lives on, and once space is freed submissions go through."""
    url = pool.url
    filler = fill(pool.state, STATE_DISK_MIB)
    try:
        out = cli(url, "submit", "--team", "ctest-a", "--", "true")
        assert out.returncode != 0, out.stdout
        assert "no disk space left" in out.stderr and "free space" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        raw = HTTP.post(f"{url}/v1/jobs", json={"command": ["true"], "team": "ctest-a"})
        assert raw.status_code == 507, raw.text
        assert HTTP.get(f"{url}/healthz", timeout=10).status_code in (200, 503)
    finally:
        filler.unlink()
    job = submit(url, "ctest-a", "--", "true")
    wait_for(lambda: show(url, job)["state"] == "succeeded", 60, "a job once space is freed")


def test_the_online_reserve_and_sizing_at_submit(pool: Pool) -> None:
    """Once online work was seen (a short online job first: the module's tests may run
    on other workers, so the elastic and service tests' may not have run on this pool),
    the 20% online reserve holds: training that checkpoints 40 GiB a GPU cannot leave
    within a cycle, so three of four run and the fourth waits with `Reserve`; an online
    job takes the last GPU, preempting nothing. A job given by its model is sized at
    submit."""
    url = pool.url

    def busy() -> list[tuple[int, str]]:
        jobs = HTTP.get(f"{url}/v1/jobs", params={"limit": 1000}, timeout=10).json()["jobs"]
        return [(j["id"], j["state"]) for j in jobs if j["state"] in ("running", "preempting")]

    # what earlier tests started (a deleted service's replicas stop with their grace) ends
    # first: the pool's four GPUs are free
    try:
        wait_for(lambda: not busy(), 180, "the pool to be idle")
    except AssertionError as err:
        raise AssertionError(f"{err}: {busy()}; {pool.node_states()}") from None
    seen_online = submit(url, "web", "--kind", "online-inference", "--", "true")
    wait_for(lambda: show(url, seen_online)["state"] == "succeeded", 60, "online work seen")
    release = pool.root / "release-reserve"
    hold = f'i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done'
    train = [
        submit(url, "ctest-a", "--kind", "training", "--checkpoint-gib", "40", "--", "sh", "-c",
               hold)
        for _ in range(4)
    ]  # fmt: skip

    def states() -> list[str]:
        return [show(url, j)["state"] for j in train]

    def seen() -> str:
        return str([(show(url, j)["state"], show(url, j)["reason_code"]) for j in train])

    try:
        wait_for(lambda: states().count("running") == 3, 90, "three to run")
    except AssertionError as err:
        raise AssertionError(f"{err}: {seen()}") from None
    (waiting,) = [j for j in train if show(url, j)["state"] == "pending"]
    wait_for(lambda: show(url, waiting)["reason_code"] == "Reserve", 30, "the reserve's reason")
    online = submit(
        url, "web", "--kind", "online-inference", "--priority", "high", "--", "sh", "-c", hold
    )
    wait_for(lambda: show(url, online)["state"] == "running", 60, "the online job to start")
    assert states().count("running") == 3  # nothing was preempted
    release.touch()
    wait_for(lambda: states().count("succeeded") == 4, 90, "the training to end")

    sized = submit(
        url, "ctest-b", "--model", "llama-3-8b", "--task", "inference", "--precision", "bf16",
        "--", "true",
    )  # fmt: skip
    wait_for(lambda: show(url, sized)["state"] == "succeeded", 60, "the sized job")
    text = cli(url, "show", str(sized)).stdout
    assert "sized by    llama-3-8b inference bf16" in text, text
    assert show(url, sized)["gpus"][0]["node"] in pool.node_states(), show(url, sized)


@RAY_ONLY
def test_a_machine_joining_under_load_joins_the_pool(pool: Pool) -> None:
    """A third machine joins (`gpupool node join`) while a job runs: the server, whose fleet
    is read at start, restarts itself in place to add it; the running job is adopted, not
    started again; the new node takes work; then it leaves (SIGTERM) and is out again."""
    url = pool.url
    job = submit_counter(pool, 400, 2, 5, "--checkpoint-every", "1s")
    wait_for(lambda: "step=5" in cli(url, "logs", str(job)).stdout, 90, "progress")
    pid = pool.server.proc.pid if pool.server.proc is not None else 0
    joined = pool.join("n3")

    def n3_up() -> bool:
        out = cli(url, "nodes", "--json")
        if out.returncode != 0:  # the server is restarting
            return False
        nodes = json.loads(out.stdout)["nodes"]
        return any(n["name"] == "n3" and n["state"] == "up" for n in nodes)

    try:
        wait_for(n3_up, 180, "n3 in the pool")
    except AssertionError as err:
        tail = joined.log.read_text(errors="replace")[-3000:] if joined.log.exists() else ""
        raise AssertionError(f"{err}; n3's join log ends:\n{tail}") from None
    assert pool.server.proc is not None and pool.server.proc.pid == pid  # restarted in place

    def temps() -> dict[str, list[float]]:
        nodes = HTTP.get(f"{url}/v1/cluster", timeout=10).json()["nodes"]
        return {n["name"]: [float(g["temp_c"] or 0) for g in n["gpus"]] for n in nodes}

    # n3's telemetry reads its hot aisle (--fake-inlet 45 C; idle in 30 C air a card
    # reads some 34 C)
    wait_for(lambda: len(temps().get("n3", [])) == 2, 30, "n3's telemetry")
    assert min(temps()["n3"]) >= 45.0, temps()
    again = show(url, job)
    assert again["state"] == "running" and again["attempts"] == 1, again  # adopted
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}).json()["events"]
    assert any(e["kind"] == "node-joined" and "n3" in e["message"] for e in events)
    work = [submit(url, "ctest-b", "--gpus", "2", "--", "sh", "-c", "sleep 3") for _ in range(2)]
    for j in work:
        wait_for(lambda j=j: show(url, j)["state"] == "succeeded", 90, f"job {j}")
    assert "n3" in nodes_of(url, work[0]) | nodes_of(url, work[1])
    # n3 is in n1's rack: a gang that requires a rack now runs there, one member a node
    assert cli(url, "cancel", str(job)).returncode == 0
    wait_for(lambda: show(url, job)["state"] == "cancelled", 60, "the counter to end")
    gang = submit(url, "ctest-b", "--gpus", "4", "--topology", "rack", "--", "sh", "-c", "sleep 1")
    wait_for(lambda: show(url, gang)["state"] == "succeeded", 90, "the rack's gang")
    assert nodes_of(url, gang) == {"n1", "n3"}, show(url, gang)
    joined.proc.send_signal(signal.SIGTERM)
    assert joined.proc.wait(90) == 0, joined.log.read_text()[-2000:]
    del pool.nodes["n3"]
    wait_for(lambda: pool.node_states()["n3"]["state"] != "up", 60, "n3 out of the pool")
