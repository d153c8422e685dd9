"""A job's run directory and what goes in it: the logs, the checkpoint and home
directories, the records of each attempt (exit, launch intent, stop), the JSON they are
written in, and the environment a job is started with. Shared by the local executor and
the Ray launcher, which lay out a run directory alike."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpupool.ports.executor.base import LaunchSpec

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
CHECKPOINT_DIR = "checkpoint"
HOME_DIR = "home"
DEFAULT_LOG_MAX_BYTES = 64 << 20
"""Each of a job's two logs is rotated at this size (one `.1` kept)."""
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
ENV_ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM"})
"""Variables of the server's environment a job inherits (and every LC_*): nothing else of
it (tokens, database URLs, cloud credentials) ever reaches a job."""


def exit_file(run_dir: Path, attempt: int) -> Path:
    """Where the shim records how attempt `attempt` ended."""
    return run_dir / f"exit-{attempt}.json"


def launch_file(run_dir: Path, attempt: int) -> Path:
    """The launch intent of attempt `attempt`: its token and cgroup, written before its
    shim starts, so that a restarted server finds its processes again."""
    return run_dir / f"launch-{attempt}.json"


def stop_file(run_dir: Path, attempt: int) -> Path:
    """Where we remember that we asked attempt `attempt` to stop, so a restarted
    scheduler still calls its end "preempted" rather than "succeeded"."""
    return run_dir / f"stop-{attempt}.json"


def read_json(path: Path) -> dict[str, Any] | None:
    """A record's JSON object; None when it is missing, torn or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Replace a record through a temporary file (readers never see half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict(data)), encoding="utf-8")
    os.replace(tmp, path)


def write_atomically(path: Path, data: Mapping[str, object]) -> None:
    """Replace `path` with `data` so that every reader sees the old content or all of the
    new. No fsync: what a launch intent finds again (the attempt's processes, its cgroup)
    lives only as long as the machine does, and every process on it sees the page cache;
    after a crash of the machine there is nothing left to find, and an intent lost with
    it reads as none (recover() then requeues the job, as it does for a torn one). The
    two fsyncs cost 1 to 15 ms on every job's way to its start."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(dict(data)).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def checkpoint_dir(spec: LaunchSpec) -> Path:
    """The attempt's checkpoint directory: in shared storage when the server has one,
    else in its run directory."""
    if spec.checkpoint_dir is not None:
        return spec.checkpoint_dir.absolute()
    return spec.run_dir.absolute() / CHECKPOINT_DIR


def job_environment(spec: LaunchSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of `base` (os.environ: PATH, LANG, LC_*, TZ, TERM) + HOME (the
    job's own home directory) + spec.env + the variables the checkpoint protocol promises.

    CUDA_DEVICE_ORDER=PCI_BUS_ID is forced because our GPU indices are NVML's, which count
    in PCI bus order; CUDA's default order ("fastest first") could name other GPUs."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if k in ENV_ALLOWED or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(spec.run_dir.absolute() / HOME_DIR)
    if spec.user is not None:
        env["USER"] = env["LOGNAME"] = spec.user.name
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = (
        spec.visible_devices
        if spec.visible_devices is not None
        else ",".join(str(i) for i in spec.gpu_indices)
    )
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["GPUPOOL_JOB_ID"] = spec.job_id
    env["GPUPOOL_ATTEMPT"] = str(spec.attempt)
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoint_dir(spec))
    if spec.resume:
        env["GPUPOOL_RESUME"] = "1"
    else:
        env.pop("GPUPOOL_RESUME", None)
    return env
