"""The live service on a real GPU: `gpupool serve` with NVML, jobs that use CUDA.

Run on a lent GPU machine, not in CI (it needs a GPU, and PyTorch for the jobs):

    python bench/device_live.py [--port 8650] [--out DIR]

Starts `gpupool serve` on this machine's GPUs (NvmlTelemetry, no --fake-gpus; SQLite in a
temporary state directory; 127.0.0.1 only) and checks, printing one JSON line per step:

1. the fleet the service reports: GPU model from the NVML name, memory, power, clocks;
2. a whole-GPU training job (bf16 matrix products for --work-s seconds): the time from
   submit to `running`, the CUDA_VISIBLE_DEVICES it got, what the GPU ran at, and the
   utilisation and power the service read while it ran;
3. a second whole-GPU job submitted while the first runs: it waits (the reason the
   service gives), then starts once the first has ended: one job per card;
4. cancelling a job that holds 20 GiB of GPU memory: how long until NVML shows the
   memory returned;
5. two online-inference jobs of 4 GiB each sharing the card: each tries to take 8 GiB;
   where MPS runs, the service's limits stop each at its share;
6. two such jobs of two teams: they take turns on the card (MPS serves one user per card
   at a time, and each team runs as its own user when the server is root);
7. /metrics, and a clean stop on SIGTERM.

Bounded: every wait has a deadline; the server is stopped (SIGTERM, then SIGKILL) on
every exit. Exits 0 when every check held, 1 when one failed, 3 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

# The job programs. They print one JSON line each; the script reads them from the logs.
TRAIN = r"""
import json, os, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
start, n = time.perf_counter(), 0
while time.perf_counter() - start < float(os.environ["WORK_S"]):
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
took = time.perf_counter() - start
print(json.dumps({
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "devices_seen": torch.cuda.device_count(),
    "name": torch.cuda.get_device_name(0),
    "tflops": round(n * 2 * 8192**3 / took / 1e12, 1),
}), flush=True)
"""

HOLD = r"""
import json, os, time, torch
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
print(json.dumps({"held_gib": 20, "cuda_visible_devices": cvd}), flush=True)
time.sleep(600)
"""

GRAB = r"""
import json, os, time, torch
got, bufs, refused = 0, [], None
for _ in range(16):
    try:
        bufs.append(torch.empty(512 * 1024**2, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        got += 512
    except Exception as exc:
        refused = str(exc).splitlines()[0][:200]
        break
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUPOOL_GPU"))}
print(json.dumps({"got_mib": got, "refused": refused, "env": env}), flush=True)
time.sleep(float(os.environ.get("HOLD_S", "6")))
"""


def emit(out: list[dict[str, Any]], kind: str, **fields: Any) -> None:
    row = {"kind": kind, **fields}
    out.append(row)
    print(json.dumps(row), flush=True)


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)


def nvml_used_mib() -> list[int]:
    import pynvml  # type: ignore[import-untyped]

    pynvml.nvmlInit()
    try:
        return [
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used // 2**20
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


class Run:
    def __init__(self, base: str, out: list[dict[str, Any]], fake: bool) -> None:
        self.http = httpx.Client(base_url=base, timeout=10.0)
        self.out = out
        self.fake = fake
        self.out_dir: Path | None = None
        self.state_dir: Path | None = None
        self.failed: list[str] = []

    def used_mib(self) -> list[int]:
        """Memory in use per GPU, read by NVML itself (the service's view on a fake fleet)."""
        if self.fake:
            return [int(g["mem_used_mib"]) for g in self.gpus()]
        return nvml_used_mib()

    def check(self, ok: bool, what: str) -> None:
        emit(self.out, "check", ok=bool(ok), what=what)
        if not ok:
            self.failed.append(what)

    def submit(self, command: list[str], **spec: Any) -> int:
        body = {"command": command, "team": "research", **spec}
        resp = self.http.post("/v1/jobs", json=body)
        resp.raise_for_status()
        return int(resp.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        resp = self.http.get(f"/v1/jobs/{job_id}")
        resp.raise_for_status()
        value: dict[str, Any] = resp.json()
        return value

    def state(self, job_id: int) -> str:
        return str(self.job(job_id)["state"])

    def logs(self, job_id: int) -> str:
        return self.http.get(f"/v1/jobs/{job_id}/logs").text

    def gpus(self) -> list[dict[str, Any]]:
        cluster = self.http.get("/v1/cluster").json()
        return [g for node in cluster["nodes"] for g in node["gpus"]]


def scenario(run: Run, python: str, work_s: float) -> None:
    out = run.out
    fleet = run.gpus()
    emit(out, "fleet", gpus=fleet)
    run.check(bool(fleet) and all(g["model"] != "unknown" for g in fleet), "NVML fleet named")

    # 2 and 3: a whole-GPU job, and a second one that must wait for its card
    env = {"WORK_S": str(work_s)}
    t0 = time.monotonic()
    first = run.submit([python, "-c", TRAIN], name="matmul", env=env, gpus=len(fleet))
    wait_for("first job running", lambda: run.state(first) == "running", 30)
    emit(out, "started", job=first, submit_to_running_ms=round((time.monotonic() - t0) * 1e3, 1))
    second = run.submit([python, "-c", TRAIN], name="matmul-2", env={"WORK_S": "3"}, gpus=1)
    samples = []
    while run.state(first) == "running" and len(samples) < work_s * 4 + 120:
        time.sleep(0.5)
        samples.append(
            {g["index"]: (g["util_pct"], g["power_w"], g["mem_used_mib"]) for g in run.gpus()}
        )
        if len(samples) == 4:
            waiting = run.job(second)
            emit(out, "second_waits", state=waiting["state"], reason=waiting["reason"])
            run.check(waiting["state"] == "pending", "second job waits while the card is busy")
    done = wait_for("first job ended", lambda: run.state(first) in ("succeeded", "failed"), 60)
    info = run.job(first)
    report = last_json(run.logs(first))
    peak_util = max((v[0] for s in samples for v in s.values()), default=0.0)
    peak_power = max((v[1] for s in samples for v in s.values()), default=0.0)
    emit(
        out,
        "first_done",
        state=info["state"],
        exit_code=info["exit_code"],
        job=report,
        peak_util_pct=peak_util,
        peak_power_w=peak_power,
        samples=len(samples),
    )
    run.check(bool(done) and info["state"] == "succeeded", "first job succeeded")
    run.check(
        report is not None and report.get("devices_seen") == len(fleet),
        "the job sees exactly the GPUs it was given",
    )
    run.check(peak_util > 50, "the service read the job's utilisation through NVML")
    wait_for("second job ran", lambda: run.state(second) in ("succeeded", "failed"), 90)
    second_info = run.job(second)
    emit(
        out,
        "second_done",
        state=second_info["state"],
        started_at=second_info["started_at"],
        first_ended_at=info["ended_at"],
        job=last_json(run.logs(second)),
    )
    run.check(
        second_info["state"] == "succeeded" and second_info["started_at"] >= info["ended_at"],
        "second started after first",
    )

    # 4: cancel a job that holds GPU memory; NVML must show the memory back
    before = run.used_mib()
    hold = run.submit([python, "-c", HOLD], name="hold", gpus=1)
    wait_for("hold job holds memory", lambda: last_json(run.logs(hold)), 60, 0.2)
    held = run.used_mib()
    t1 = time.monotonic()
    run.http.post(f"/v1/jobs/{hold}/cancel").raise_for_status()
    wait_for("hold job cancelled", lambda: run.state(hold) == "cancelled", 90)
    ended_ms = (time.monotonic() - t1) * 1e3
    seen = max(held) - max(before) > 19_000
    run.check(seen, "the held 20 GiB showed in NVML")
    back_ms = None
    if seen:
        wait_for("memory returned", lambda: max(run.used_mib()) < max(held) - 19_000, 60)
        back_ms = round((time.monotonic() - t1) * 1e3, 1)
    emit(
        out,
        "cancel",
        used_mib_before=before,
        used_mib_holding=held,
        cancel_to_cancelled_ms=round(ended_ms, 1),
        cancel_to_memory_back_ms=back_ms,
    )

    # 5: two 4 GiB online-inference shares on one card, each trying 8 GiB
    share = [
        run.submit(
            [python, "-c", GRAB],
            name=f"share-{i}",
            kind="online-inference",
            gpu_mem_mib=4096,
            env={"HOLD_S": "8"},
        )
        for i in range(2)
    ]
    wait_for(
        "shares ended", lambda: all(run.state(j) in ("succeeded", "failed") for j in share), 120
    )
    rows = [{"job": j, **run.job(j), "report": last_json(run.logs(j))} for j in share]
    overlap = max(r["started_at"] for r in rows) < min(r["ended_at"] for r in rows)
    emit(
        out,
        "shares",
        jobs=[
            {k: r[k] for k in ("job", "state", "gpus", "started_at", "ended_at", "report")}
            for r in rows
        ],
        ran_together=overlap,
    )
    run.check(overlap, "two shares ran on the card together")
    got = [r["report"]["got_mib"] for r in rows if r["report"]]
    mps = all(
        r["report"] and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in r["report"]["env"] for r in rows
    )
    logs = {}
    if run.state_dir:
        logs = {
            str(p.relative_to(run.state_dir)): p.read_text()[-800:]
            for p in sorted(run.state_dir.glob("**/*.log"))
            if "mps" in str(p)
        }
    emit(out, "mps", enforced_env=mps, got_mib=got, logs=logs)
    if mps:
        run.check(all(g <= 4096 for g in got), "MPS held each share to its 4 GiB")

    # 6: shares of two teams (two users): MPS serves one user per card, so they take turns
    teams = [
        run.submit(
            [python, "-c", GRAB],
            name=f"team-{team}",
            team=team,
            kind="online-inference",
            gpu_mem_mib=4096,
            env={"HOLD_S": "4"},
        )
        for team in ("research", "vision")
    ]
    wait_for(
        "teams ended", lambda: all(run.state(j) in ("succeeded", "failed") for j in teams), 120
    )
    rows = [run.job(j) for j in teams]
    apart = max(r["started_at"] for r in rows) >= min(r["ended_at"] for r in rows)
    emit(
        out,
        "two_teams",
        jobs=[{k: r[k] for k in ("id", "team", "state", "started_at", "ended_at")} for r in rows],
        took_turns=apart,
        reports=[last_json(run.logs(j)) for j in teams],
    )
    run.check(apart and all(r["state"] == "succeeded" for r in rows), "two teams took turns")

    metrics = run.http.get("/metrics").text
    if run.out_dir:
        (run.out_dir / "metrics.txt").write_text(metrics)
    emit(out, "metrics", lines=len(metrics.splitlines()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8650)
    parser.add_argument("--out", type=Path, default=None, help="write result.json and serve.log")
    parser.add_argument("--work-s", type=float, default=12.0, help="seconds of matrix products")
    parser.add_argument("--job-python", default=sys.executable, help="python with torch")
    parser.add_argument("--fake-gpus", help="rehearse the script on a fake fleet (no checks hold)")
    args = parser.parse_args(argv)

    if not args.fake_gpus:
        try:
            nvml_used_mib()
        except Exception as exc:  # no driver, no GPU
            print(f"no GPU: {exc}", flush=True)
            return 3
    out: list[dict[str, Any]] = []
    state = Path(tempfile.mkdtemp(prefix="gpupool-device-"))
    log_path = (args.out or state) / "serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{args.port}"
    cmd = [
        sys.executable,
        "-m",
        "gpupool",
        "serve",
        "--auth",
        "none",
        "--state-dir",
        str(state),
        "--port",
        str(args.port),
        "--cycle",
        "0.5",
        "--sample",
        "0.5",
    ]
    if args.fake_gpus:
        cmd += ["--fake-gpus", args.fake_gpus]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    run = Run(base, out, fake=bool(args.fake_gpus))
    run.out_dir = args.out
    run.state_dir = state
    code = 1
    try:

        def healthy() -> bool:
            if server.poll() is not None:
                raise RuntimeError(f"gpupool serve exited {server.returncode}: see {log_path}")
            try:
                return bool(run.http.get("/healthz").json().get("ok"))
            except httpx.HTTPError:
                return False

        t0 = time.monotonic()
        wait_for("server healthy", healthy, 60, 0.1)
        emit(out, "serve_up", seconds=round(time.monotonic() - t0, 2))
        scenario(run, args.job_python, args.work_s)
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=60)
        # uvicorn re-raises the SIGTERM it handled once it has shut down: -15 is a clean stop
        run.check(rc in (0, -signal.SIGTERM), f"serve stopped on SIGTERM within 60 s (exit {rc})")
        code = 0 if not run.failed else 1
    except Exception as exc:
        emit(out, "error", error=f"{type(exc).__name__}: {exc}")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        emit(out, "summary", failed=run.failed, exit=code)
        if args.out:
            (args.out / "result.json").write_text(json.dumps(out, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
