"""Two MPS-limited jobs on one GPU: what NVML reports for each (needs a real GPU).

Starts an MPS control daemon for GPU 0 only (its own pipe and log directories in a temp
directory), runs two clients with the environment gpupool gives a sharing job
(server/executors/mps.py: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
each trying to allocate twice its limit through the CUDA driver API (ctypes, libcuda),
then prints what each client got and what NVML reports per process. Bounded: each
client stops after 60 s, the whole run after 150 s; the daemon is always quit.

    python bench/device_sharing.py [--limit-mib 2048] [--percent 25]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpupool.server.executors.mps import ShareRequest, mps_limits

CLIENT = r"""
import ctypes, json, sys, time
want_mib, step_mib = int(sys.argv[1]), 256
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        raise SystemExit(json.dumps({"error": f"{what} failed: CUDA error {rc}"}))
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
got, bufs, refused = 0, [], None
while got < want_mib:
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(step_mib << 20))
    if rc != 0:
        refused = rc
        break
    bufs.append(ptr)
    got += step_mib
print(json.dumps({"allocated_mib": got, "refused_with": refused}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def nvml_processes() -> list[dict[str, object]]:
    """Per-process GPU memory on GPU 0, from NVML (pynvml), else nvidia-smi."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            rows: list[dict[str, object]] = [
                {"gpu_util_pct": util.gpu, "mem_used_mib": mem.used >> 20}
            ]
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory
                rows.append({"pid": p.pid, "used_mib": None if used is None else used >> 20})
            return rows
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        out = subprocess.run(
            [
                "nvidia-smi",
                "-i",
                "0",
                "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return [{"nvidia-smi": line} for line in out.stdout.splitlines()]


def first_gpu_uuid() -> str:
    """GPU 0's UUID: the name the MPS daemon and its clients are given the card by."""
    return subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mib", type=int, default=2048)
    ap.add_argument("--percent", type=int, default=25)
    args = ap.parse_args()
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        print("no nvidia-cuda-mps-control on PATH: MPS is not available here")
        return 2
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        print("no libcuda.so.1: no NVIDIA driver here")
        return 2
    uuid = first_gpu_uuid()
    deadline = time.monotonic() + 150
    root = Path(tempfile.mkdtemp(prefix="gpupool-mps-"))
    pipe, log = root / "pipe", root / "log"
    pipe.mkdir()
    log.mkdir()
    daemon_env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log),
    }
    subprocess.run([control, "-d"], env=daemon_env, timeout=20, check=True)
    clients: list[subprocess.Popen[str]] = []
    try:
        share = ShareRequest(0, uuid, args.percent * 10, args.limit_mib)
        client_env = {**daemon_env, **mps_limits(share)}
        print("client limits:", json.dumps(mps_limits(share)))
        for _ in range(2):
            clients.append(
                subprocess.Popen(
                    [sys.executable, "-c", CLIENT, str(2 * args.limit_mib), "20"],
                    env=client_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for k, c in enumerate(clients):
            assert c.stdout is not None
            line = c.stdout.readline().strip()
            print(f"client {k} (pid {c.pid}): {line}")
        time.sleep(2)
        print("NVML:", json.dumps(nvml_processes()))
        for c in clients:
            c.wait(timeout=max(1.0, min(60.0, deadline - time.monotonic())))
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait(5)
        subprocess.run(
            [control], input="quit\n", env=daemon_env, text=True, timeout=20, check=False
        )
        print("MPS daemon quit; logs in", log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
