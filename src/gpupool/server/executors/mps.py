"""NVIDIA MPS for jobs that share a GPU: one control daemon per card, limits per client.

A job with part of a GPU (gpu_milli < 1000) is told its share in its environment
(GPUPOOL_GPU_SHARE, GPUPOOL_GPU_MEM_MIB). Where the driver has MPS
(`nvidia-cuda-mps-control` on PATH) and the jobs run on real GPUs, the share is also
enforced: the card gets an MPS control daemon of its own (its pipe and log directories
under the state directory, CUDA_VISIBLE_DEVICES naming the card by UUID, as NVIDIA
recommends because the server renumbers the devices it sees), and the job connects to
it with

- CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=<MiB>M": device 0 of the client (its one GPU)
  may hold at most that much memory; an allocation past it fails in the job;
- CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: its share of the SMs, rounded up to a percent.

Without MPS nothing stops a job from using more than its share: the variables are
advisory (docs/sharing.md says which is which). `FakeMps` stands in for the daemons in
tests; `SystemMps` runs the real ones.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpupool.errors import GpupoolError

MPS_CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 10.0


class MpsError(GpupoolError):
    """The MPS control daemon could not be started (the job then runs advisory)."""


@dataclass(frozen=True)
class ShareRequest:
    """A job's part of one card: the card (NVML index and UUID), its share, its memory."""

    device_index: int
    device_uuid: str
    gpu_milli: int
    mem_mib: int


class Mps(Protocol):
    """Where MPS runs: the environment of a job on a share (None: MPS not here)."""

    def client_env(self, share: ShareRequest) -> dict[str, str] | None: ...

    def close(self) -> None: ...


def share_env(share: ShareRequest, mps: Mps | None) -> dict[str, str]:
    """The environment a sharing job gets: its share always, MPS's limits where MPS runs.

    GPUPOOL_GPU_SHARE_ENFORCED says which: `mps` or `advisory`."""
    env = {
        "GPUPOOL_GPU_SHARE": f"{share.gpu_milli / 1000:.3f}",
        "GPUPOOL_GPU_MEM_MIB": str(share.mem_mib),
        "GPUPOOL_GPU_SHARE_ENFORCED": "advisory",
    }
    client = mps.client_env(share) if mps is not None else None
    if client is not None:
        env.update(client)
        env["GPUPOOL_GPU_SHARE_ENFORCED"] = "mps"
    return env


def mps_limits(share: ShareRequest) -> dict[str, str]:
    """The two per-client limits MPS reads from a client's environment."""
    return {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share.mem_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, math.ceil(share.gpu_milli / 10))),
    }


def reachable_dir(path: Path) -> None:
    """Make a directory of the daemons' that jobs running as other users can reach (0711:
    they open the control pipe by name, and list nothing). Under the server's umask it
    would be 0700, and a job that cannot reach the pipe runs without MPS, silently: on an
    H200 such a job took twice its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    (bench/device_mps_access.py)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o711)


class NoMps:
    """No MPS here (no driver tool, a fake fleet, a remote executor): shares are advisory."""

    def client_env(self, share: ShareRequest) -> dict[str, str] | None:
        return None

    def close(self) -> None:
        return None


class _Daemons:
    """One control daemon per card, started at its first sharer, quit at close."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.started: dict[int, tuple[str, Path, Path]] = {}
        """NVML index -> (UUID, pipe directory, log directory)."""

    def dirs(self, share: ShareRequest) -> tuple[Path, Path]:
        base = self.root / f"gpu{share.device_index}"
        return base / "pipe", base / "log"

    def daemon_env(self, uuid: str, pipe: Path, log: Path) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
        }

    def client_env(self, share: ShareRequest) -> dict[str, str]:
        with self.lock:
            found = self.started.get(share.device_index)
            if found is None:
                pipe, log = self.dirs(share)
                for d in (self.root, pipe.parent, pipe, log):
                    reachable_dir(d)
                self.start(self.daemon_env(share.device_uuid, pipe, log))
                found = self.started[share.device_index] = (share.device_uuid, pipe, log)
        uuid, pipe, log = found
        env = self.daemon_env(uuid, pipe, log)
        env.update(mps_limits(share))
        return env

    def close(self) -> None:
        with self.lock:
            started, self.started = self.started, {}
        for uuid, pipe, log in started.values():
            self.stop(self.daemon_env(uuid, pipe, log))

    def start(self, env: Mapping[str, str]) -> None:
        raise NotImplementedError

    def stop(self, env: Mapping[str, str]) -> None:
        raise NotImplementedError


class SystemMps(_Daemons):
    """The driver's MPS: `nvidia-cuda-mps-control -d` per card, `quit` on close."""

    def __init__(self, root: Path, control: str = MPS_CONTROL) -> None:
        super().__init__(root)
        self.control = control

    def _run(self, env: Mapping[str, str], args: list[str], stdin: str | None) -> None:
        full = {**os.environ, **env}
        try:
            done = subprocess.run(
                [self.control, *args],
                input=stdin,
                env=full,
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise MpsError(f"{self.control} {' '.join(args)} failed: {err}") from err
        if done.returncode != 0:
            raise MpsError(
                f"{self.control} {' '.join(args)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[:300]}"
            )

    def start(self, env: Mapping[str, str]) -> None:
        self._run(env, ["-d"], None)

    def stop(self, env: Mapping[str, str]) -> None:
        with contextlib.suppress(MpsError):  # already gone (driver reloaded, shutting down)
            self._run(env, [], "quit\n")


class FakeMps(_Daemons):
    """Records the daemons it would start and stop (tests); hands out the real env."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.starts: list[dict[str, str]] = []
        self.stops: list[dict[str, str]] = []

    def start(self, env: Mapping[str, str]) -> None:
        self.starts.append(dict(env))

    def stop(self, env: Mapping[str, str]) -> None:
        self.stops.append(dict(env))


def detect_mps(
    root: Path, real_gpus: bool, which: Callable[[str], str | None] = shutil.which
) -> Mps:
    """SystemMps where the jobs run on real GPUs and the driver ships MPS; else NoMps."""
    if not real_gpus:
        return NoMps()
    control = which(MPS_CONTROL)
    return SystemMps(root, control) if control is not None else NoMps()
