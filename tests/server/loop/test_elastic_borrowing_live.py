"""Borrowing without interruption, through a real `gpupool serve` on a fake fleet.

An elastic offline job (`--gpus 2..4`) holds the whole 4-GPU node. An online peak (two
online-inference jobs) finds no free GPU: the core shrinks the elastic job to 2 (it
checkpoints on SIGTERM and restarts on 2 GPUs) and the online jobs start on the two it
gave up. Once the peak has passed it grows back to 4. Throughout, the offline job stays
`running` (never preempting or suspended, no preemption counted) and the items it has
processed (its checkpointed step) never go back.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service_proc import HTTP, Server, cli, wait_for

CONFIG = """\
teams:
  - {name: serving}
  - {name: batch}
elastic: {grow_after_s: 3}
"""

pytestmark = pytest.mark.slow


def _serve_args(tmp_path: Path) -> tuple[str, ...]:
    """A 4-GPU fake fleet, no auth, the test's service.yaml, a fast loop."""
    config = str(tmp_path / "service.yaml")
    fleet = ("--fake-gpus", "4xA100-80GB", "--auth", "none")
    return (*fleet, "--config", config, "--cycle", "0.2", "--sample", "0.5")


@pytest.fixture()
def server(tmp_path: Path) -> Server:
    (tmp_path / "service.yaml").write_text(CONFIG, encoding="utf-8")
    srv = Server(tmp_path / "state", *_serve_args(tmp_path)).start()
    yield srv  # type: ignore[misc]
    srv.stop()


def _job(url: str, job_id: int) -> dict[str, Any]:
    got: dict[str, Any] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return got


def _processed(state_dir: Path, job_id: int) -> int:
    """The offline job's processed-items counter: the step of its last checkpoint."""
    path = state_dir / "jobs" / str(job_id) / "checkpoint" / "counter.json"
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _submit(url: str, *args: str) -> int:
    out = cli(url, "submit", "--json", *args)
    assert out.returncode == 0, out.stderr
    job_id: int = json.loads(out.stdout)["id"]
    return job_id


def test_elastic_job_lends_two_gpus_to_an_online_peak_and_gets_them_back(
    server: Server,
) -> None:
    url = server.url
    counter = (
        f"echo gpus=$GPUPOOL_GPU_COUNT resume=${{GPUPOOL_RESUME:-0}}; exec {sys.executable} "
        "-m gpupool.examples.ckpt_counter --steps 100000 --step-s 0.02 --every 5"
    )
    offline = _submit(
        url,
        "--gpus",
        "2..4",
        "--kind",
        "offline-inference",
        "--team",
        "batch",
        "--grace",
        "20s",
        "--",
        "sh",
        "-c",
        counter,
    )
    wait_for(
        lambda: len(_job(url, offline)["gpus"]) == 4 and _processed(server.state_dir, offline) > 0,
        30,
        "the elastic job to run on all 4 GPUs",
    )
    shown = cli(url, "show", str(offline))
    assert "elastic 2..4" in shown.stdout, shown.stdout
    refused = HTTP.post(
        f"{url}/v1/jobs",
        json={
            "command": ["true"],
            "kind": "online-inference",
            "team": "serving",
            "gpus": 4,
            "gpus_min": 2,
        },
        timeout=10,
    )
    assert refused.status_code == 422, refused.text
    assert "only offline-inference, batch and training jobs can be elastic" in refused.text
    # the online peak: two replicas' worth of online inference, for a dozen seconds each,
    # submitted together (straight to the API: the CLI takes a second per call)
    body = {
        "command": [sys.executable, "-c", "import time; time.sleep(12); print('served')"],
        "kind": "online-inference",
        "team": "serving",
        "gpus": 1,
    }
    online = []
    for _ in range(2):
        got = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10)
        assert got.status_code in (200, 201), got.text
        online.append(int(got.json()["id"]))
    seen_counts: list[int] = []
    last = 0
    online_ran_beside = False
    deadline = time.monotonic() + 90
    polls = 0
    while time.monotonic() < deadline and polls < 2000:
        polls += 1
        job = _job(url, offline)
        assert job["state"] == "running" and not job["preempting"], job
        done = _processed(server.state_dir, offline)
        assert done >= last, f"processed items went back: {last} -> {done}"
        last = done
        count = len(job["gpus"])
        if not seen_counts or seen_counts[-1] != count:
            seen_counts.append(count)
        states = [_job(url, j)["state"] for j in online]
        if count == 2 and "running" in states:
            online_ran_beside = True
        if all(s == "succeeded" for s in states) and count == 4 and 2 in seen_counts:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no shrink and grow back in time: GPU counts {seen_counts}")
    assert online_ran_beside, seen_counts
    assert 2 in seen_counts and seen_counts[-1] == 4, seen_counts
    job = _job(url, offline)
    assert job["preemptions"] == 0 and job["state"] == "running", job
    assert job["attempts"] >= 3, job  # started, restarted on 2, restarted on 4
    events = HTTP.get(f"{url}/v1/events", params={"after": 0}, timeout=10).json()["events"]
    mine = [e for e in events if e["job_id"] == offline]
    kinds = [e["kind"] for e in mine]
    assert "preempting" not in kinds and "suspended" not in kinds, kinds
    assert kinds.count("resizing") >= 2 and kinds.count("resized") >= 2, kinds
    reasons = [e["message"] for e in mine if e["kind"] == "resizing"]
    # the peak took two GPUs: in one resize, or one per online job as they arrived
    lent = [m for m in reasons if "to online job" in m]
    assert lent and lent[0].count(" -> ") == 1 and lent[-1].endswith(" -> 2"), reasons
    assert sum(int(m.split("lent ")[1].split(" GPU")[0]) for m in lent) == 2, reasons
    assert all(str(j) in " ".join(lent) for j in online), reasons
    assert "grew back by 2 GPUs" in reasons[-1] and reasons[-1].endswith("2 -> 4"), reasons
    # each attempt was told how many GPUs it got, and the restarts resumed (the third
    # attempt's first line may follow its header by a moment on a loaded machine)
    told = ("gpus=4 resume=0", "gpus=2 resume=1", "gpus=4 resume=1")

    def log_has_all() -> bool:
        return all(line in cli(url, "logs", str(offline)).stdout for line in told)

    wait_for(log_has_all, 30, f"the job's log to say {told}")
    log = cli(url, "logs", str(offline)).stdout
    assert "resumed from step=" in log, log
    wait_for(lambda: _processed(server.state_dir, offline) > last, 20, "progress after growth")
    assert cli(url, "cancel", str(offline)).returncode == 0


SLOW_CHECKPOINT = """\
import json, os, signal, sys, time
from pathlib import Path
stop = False
def on_term(signum, frame):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
ckpt = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "counter.json"
step = 0
if os.environ.get("GPUPOOL_RESUME") == "1" and ckpt.is_file():
    step = json.loads(ckpt.read_text())["step"]
print(f"gpus={os.environ.get('GPUPOOL_GPU_COUNT')} from={step}", flush=True)
def save():
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, ckpt)
while step < 100000:
    if stop:
        time.sleep(4)  # a large checkpoint: the server is killed while it is written
        save()
        print(f"SIGTERM: saved step={step}", flush=True)
        sys.exit(0)
    step += 1
    time.sleep(0.02)
    if step % 5 == 0:
        save()
"""


def test_a_server_killed_mid_resize_finishes_the_resize_once(tmp_path: Path) -> None:
    """The server dies while the elastic job writes its checkpoint for a resize: the
    restarted server re-adopts the process, lets it finish, and relaunches it once on
    its new GPUs; the job never leaves `running` and its counter never goes back."""
    (tmp_path / "service.yaml").write_text(
        CONFIG.replace("grow_after_s: 3", "grow_after_s: 3600"), encoding="utf-8"
    )
    script = tmp_path / "slow_checkpoint.py"
    script.write_text(SLOW_CHECKPOINT, encoding="utf-8")
    args = _serve_args(tmp_path)
    state = tmp_path / "state"
    first = Server(state, *args).start()
    second: Server | None = None
    try:
        url = first.url
        offline = _submit(
            url,
            "--gpus",
            "2..4",
            "--kind",
            "offline-inference",
            "--team",
            "batch",
            "--grace",
            "30s",
            "--",
            sys.executable,
            str(script),
        )
        wait_for(
            lambda: len(_job(url, offline)["gpus"]) == 4 and _processed(state, offline) > 0,
            30,
            "the elastic job to run on 4 GPUs",
        )
        online = _submit(
            url,
            "--gpus",
            "1",
            "--kind",
            "online-inference",
            "--team",
            "serving",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        )

        def resizing() -> bool:
            events = HTTP.get(f"{url}/v1/events", params={"after": 0}, timeout=10).json()
            return any(e["kind"] == "resizing" and e["job_id"] == offline for e in events["events"])

        wait_for(resizing, 30, "the resize to begin")
        before = _processed(state, offline)
        first.kill()  # mid-checkpoint: the job still runs, its GPUs not yet given back
        second = Server(state, *args).start()
        url = second.url
        last = before
        deadline = time.monotonic() + 60
        polls = 0
        while time.monotonic() < deadline and polls < 600:
            polls += 1
            job = _job(url, offline)
            assert job["state"] == "running" and not job["preempting"], job
            done = _processed(state, offline)
            assert done >= last, f"processed items went back: {last} -> {done}"
            last = done
            if len(job["gpus"]) == 3 and _job(url, online)["state"] == "running":
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the resize did not finish: {_job(url, offline)}")
        wait_for(lambda: _processed(state, offline) > last, 20, "progress on 3 GPUs")
        job = _job(url, offline)
        assert job["attempts"] == 2 and job["preemptions"] == 0, job  # relaunched once
        events = HTTP.get(f"{url}/v1/events", params={"after": 0}, timeout=10).json()
        kinds = [e["kind"] for e in events["events"] if e["job_id"] == offline]
        assert kinds.count("resized") == 1 and "suspended" not in kinds, kinds
        log = cli(url, "logs", str(offline)).stdout
        assert log.count("gpus=4 from=0") == 1 and log.count("gpus=3 from=") == 1, log
        assert "SIGTERM: saved" in log
        assert cli(url, "cancel", str(offline)).returncode == 0
        assert cli(url, "cancel", str(online)).returncode == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()


def _service(url: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = HTTP.get(f"{url}/v1/services/{name}", timeout=10).json()
    return got


def test_service_replicas_borrow_from_an_elastic_job_and_give_the_gpus_back(
    tmp_path: Path,
) -> None:
    """The mission's case with a real service: chat holds one GPU, an elastic offline job
    the other three. Chat's minimum goes to 3 (a peak an operator saw coming); with no free
    GPU its two new replicas take two of the elastic job's cards, which keeps running on
    one. When the minimum goes back to 1 the surplus replicas stop and the job grows back
    to 3; its state never leaves `running` and its counter never goes back."""
    (tmp_path / "service.yaml").write_text(
        CONFIG + "autoscale: {down_stable_s: 2}\n", encoding="utf-8"
    )
    srv = Server(tmp_path / "state", *_serve_args(tmp_path)).start()
    try:
        url = srv.url
        made = cli(
            url,
            "service",
            "create",
            "chat",
            "--team",
            "serving",
            "--replicas",
            "1..4",
            "--slo-p99-ms",
            "200",
            "--",
            sys.executable,
            "-m",
            "gpupool.examples.chat_replica",
        )
        assert made.returncode == 0, made.stderr
        wait_for(
            lambda: [r["state"] for r in _service(url, "chat")["replicas"]] == ["running"],
            30,
            "chat's first replica to serve",
        )
        offline = _submit(
            url,
            "--gpus",
            "1..3",
            "--kind",
            "offline-inference",
            "--team",
            "batch",
            "--grace",
            "20s",
            "--",
            sys.executable,
            "-m",
            "gpupool.examples.ckpt_counter",
            "--steps",
            "100000",
            "--step-s",
            "0.02",
            "--every",
            "5",
        )
        wait_for(
            lambda: len(_job(url, offline)["gpus"]) == 3 and _processed(srv.state_dir, offline) > 0,
            30,
            "the elastic job to run on the 3 spare GPUs",
        )
        scaled = cli(url, "service", "scale", "chat", "3..4")
        assert scaled.returncode == 0, scaled.stderr
        seen_counts = [3]  # waited for above; the lend may be done before the first poll
        phase = "peak"
        last = 0
        deadline = time.monotonic() + 120
        polls = 0
        while time.monotonic() < deadline and polls < 1200:
            polls += 1
            job = _job(url, offline)
            assert job["state"] == "running" and not job["preempting"], job
            done = _processed(srv.state_dir, offline)
            assert done >= last, f"processed items went back: {last} -> {done}"
            last = done
            count = len(job["gpus"])
            if not seen_counts or seen_counts[-1] != count:
                seen_counts.append(count)
            serving = [r for r in _service(url, "chat")["replicas"] if r["state"] == "running"]
            if phase == "peak" and count == 1 and len(serving) == 3:
                phase = "after"
                back = cli(url, "service", "scale", "chat", "1..4")
                assert back.returncode == 0, back.stderr
            elif phase == "after" and count == 3 and len(serving) == 1:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"no lend and give-back in time ({phase}): {seen_counts}")
        assert seen_counts[0] == 3 and 1 in seen_counts and seen_counts[-1] == 3, seen_counts
        job = _job(url, offline)
        assert job["preemptions"] == 0, job
        events = HTTP.get(f"{url}/v1/events", params={"after": 0}, timeout=10).json()["events"]
        lent = [
            e["message"]
            for e in events
            if e["job_id"] == offline and e["kind"] == "resizing" and "lent" in e["message"]
        ]
        assert lent and lent[-1].endswith(" -> 1"), lent
        scales = [e["message"] for e in events if e["kind"] == "service-scaled"]
        assert any(m.endswith("1 -> 3") for m in scales), scales
        assert any(m.endswith(" -> 1") for m in scales), scales
        wait_for(lambda: _processed(srv.state_dir, offline) > last, 20, "progress after growth")
    finally:
        srv.stop()
