"""Which MPS directory modes hold a job that runs as another user (needs a real GPU, root).

The live service runs each team's jobs as the team's own user and the MPS control daemon
as root. This runs the daemon as the service does (server/executors/mps.py: pipe and log
directories per card, CUDA_VISIBLE_DEVICES by UUID) with its directories in various
modes (the service makes them 0711 with `reachable_dir`), and clients
(bench/device_sharing.py's CLIENT: the CUDA driver API through ctypes) as unprivileged
users, each asking for twice its
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. A client held by MPS is refused at its limit; one that
never reached the daemon gets all it asks for. Then two users on one card: does the
second wait for the first (MPS runs one user's server per card at a time)?

    python bench/device_mps_access.py [--limit-mib 1024]

Prints one JSON line per case. Bounded: each client at most 40 s, each daemon is quit.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from device_sharing import CLIENT, first_gpu_uuid  # type: ignore[import-not-found]

USERS = ("gpupool-mpsa", "gpupool-mpsb")


def ensure_user(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", name],
            check=True,
            timeout=30,
        )
        return pwd.getpwnam(name).pw_uid


def client(env: dict[str, str], user: str | None, want_mib: int, hold_s: float):
    kwargs = {"user": user, "group": user, "extra_groups": []} if user else {}
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(want_mib), str(hold_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
        **kwargs,
    )


def read(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, float]:
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return "timeout: " + out.strip()[:200], time.monotonic() - start
    return out.strip()[:300], time.monotonic() - start


def case(
    control: str,
    uuid: str,
    name: str,
    parent_mode: int,
    pipe_mode: int,
    log_mode: int,
    users: list[str | None],
    limit_mib: int,
    stagger_s: float = 0.0,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpupool-mpsx-"))
    os.chmod(root, 0o711)
    card = root / "gpu0"
    card.mkdir(mode=parent_mode)
    os.chmod(card, parent_mode)
    pipe, log = card / "pipe", card / "log"
    pipe.mkdir()
    log.mkdir()
    os.chmod(pipe, pipe_mode)
    os.chmod(log, log_mode)
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log),
    }
    env.pop("PYTHONPATH", None)
    subprocess.run([control, "-d"], env=env, timeout=20, check=True)
    cenv = {
        **env,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    results = []
    try:
        procs = []
        for k, user in enumerate(users):
            if k and stagger_s:
                time.sleep(stagger_s)
            procs.append((user, time.monotonic(), client(cenv, user, 2 * limit_mib, 8.0)))
        for user, started, proc in procs:
            out, _ = read(proc, 40.0)
            results.append(
                {
                    "user": user or "root",
                    "out": out,
                    "s_to_exit": round(time.monotonic() - started, 2),
                }
            )
    finally:
        subprocess.run([control], input="quit\n", env=env, text=True, timeout=20, check=False)
        logs = {p.name: p.read_text()[-600:] for p in log.glob("*.log")}
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "case": name,
                "modes": [oct(parent_mode), oct(pipe_mode), oct(log_mode)],
                "clients": results,
                "logs": logs,
            }
        ),
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mib", type=int, default=1024)
    args = ap.parse_args()
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None or os.geteuid() != 0:
        print("needs root and nvidia-cuda-mps-control")
        return 2
    uuid = first_gpu_uuid()
    a, b = USERS
    for user in USERS:
        ensure_user(user)
    lim = args.limit_mib
    case(control, uuid, "root client (baseline)", 0o700, 0o700, 0o700, [None], lim)
    case(control, uuid, "user, dirs 0700 (as the service made them)", 0o700, 0o700, 0o700, [a], lim)
    case(control, uuid, "user, card 0711, pipe 0711, log 0711", 0o711, 0o711, 0o711, [a], lim)
    case(control, uuid, "user, card 0711, pipe 0755, log 0755", 0o711, 0o755, 0o755, [a], lim)
    case(control, uuid, "user, card 0711, pipe 1777, log 1777", 0o711, 0o1777, 0o1777, [a], lim)
    case(
        control,
        uuid,
        "two users, 1777, second 2 s later",
        0o711,
        0o1777,
        0o1777,
        [a, b],
        lim,
        stagger_s=2.0,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
