"""Starting one attempt on this machine, contained: its run directory laid out for its
team's user, its launch intent written before anything of it runs, its cgroup (limits,
GPU devices) made before its shim is handed the job, the shim run as the team's user with
the logs capped. The local executor and every Ray node's launcher start jobs through
`start_attempt`, and find, signal and kill them through `AttemptProcesses`."""

from __future__ import annotations

import contextlib
import marshal
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError, Unavailable
from gpupool.ports.executor.base import JobUser, LaunchSpec
from gpupool.server.agent.processes import TOKEN_ENV, pgid_of, read_start_ticks, token_pids
from gpupool.server.executors import shim as shim_module
from gpupool.server.executors.files import (
    CHECKPOINT_DIR,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_PATH,
    HOME_DIR,
    STDERR_LOG,
    STDOUT_LOG,
    exit_file,
    job_environment,
    launch_file,
    stop_file,
    write_atomically,
)
from gpupool.server.isolation.cgroups import BASE_DEVICES, Cgroups, DeviceRule, gpu_device_rules

CGROUP_PARENT = "gpupool"
SHIM_MODULE = "gpupool.server.executors.shim"
SHIM_MODULES = (SHIM_MODULE, "gpupool.service.shim")
"""The names a shim's command line carries: this layout's, and the one before it (shims a
server of the previous release started, adopted after an upgrade)."""
_SHIM_BOOT = (
    "import sys;sys.path.append(sys.argv[2]);del sys.argv[1:3];import shim;sys.exit(shim.main())"
)


def shim_command(python: str = sys.executable) -> list[str]:
    """How a shim is started: `python -I -S -c BOOT gpupool.server.executors.shim DIR`, BOOT
    importing `shim` from DIR, the shim module's own directory (the shim imports nothing
    from gpupool). -I: neither the job's nor the server's PYTHON* variables, user site or
    working directory can change its code; -S: no site-packages, no .pth files, which
    with -m's runpy were a third of its start-up (13 -> 8 ms on this host); it is the shim
    of this install, not whichever gpupool site-packages names. The module's name stays
    in the command line: adoption and the tests find a shim by it."""
    here = str(Path(shim_module.__file__).parent)
    return [python, "-I", "-S", "-c", _SHIM_BOOT, SHIM_MODULE, here]


def cgroup_name(job_id: str, attempt: int, token: str) -> str:
    """The attempt's own cgroup: unique per job, attempt and launch."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:64]
    return f"{CGROUP_PARENT}/job-{safe}-a{attempt}-{token[:12]}"


@dataclass(frozen=True)
class Containment:
    """How this machine contains what it starts: `cgroups` None runs without (processes
    are then found by their launch token); `log_max_bytes` None leaves the logs uncapped."""

    cgroups: Cgroups | None
    log_max_bytes: int | None = DEFAULT_LOG_MAX_BYTES
    devices_dir: Path = Path("/dev")
    base_devices: tuple[DeviceRule, ...] = BASE_DEVICES


@dataclass(frozen=True)
class Started:
    """A shim started for an attempt: handed its job, or (`handed` False) killed before it
    ran anything, which its exit record and poll then tell."""

    proc: subprocess.Popen[bytes]
    token: str
    cgroup: str
    record: Path
    ticks: int
    handed: bool = True


def prepare_dirs(
    run_dir: Path, log_dir: Path, user: JobUser | None, checkpoints: Path | None = None
) -> None:
    """The run directory: with a user, the server's (0711: the job can reach its own
    parts but not list or change the records in it); the checkpoint directory (in shared
    storage, or checkpoint/ here) and home/ the job's (0700); the logs (in `log_dir`, the
    run directory or a gang member's) the server's, readable by the job's group (0640)."""
    ckpt = checkpoints if checkpoints is not None else run_dir / CHECKPOINT_DIR
    for d in (ckpt, run_dir / HOME_DIR):
        d.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    for d in {run_dir, log_dir}:
        os.chown(d, 0, 0)
        os.chmod(d, 0o711)
    for d in (ckpt, run_dir / HOME_DIR):
        os.lchown(d, user.uid, user.gid)
        os.chmod(d, 0o700)
    for name in (STDOUT_LOG, STDERR_LOG):
        path = log_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
        try:
            os.fchown(fd, 0, user.gid)
            os.fchmod(fd, 0o640)
        finally:
            os.close(fd)


def abandon(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap a shim that was never handed its job (a launch that failed after
    it started); it has started nothing."""
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@dataclass(frozen=True)
class LaunchContext:
    """What the machine adds to an attempt: `log_dir` (a gang member's, else the run
    directory), variables on top of the job's environment, fields for the shim (the
    Ray launcher's fence on its raylet) and the priority it runs at."""

    log_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    shim_fields: Mapping[str, Any] = field(default_factory=dict)
    nice: int | None = None


def start_attempt(
    spec: LaunchSpec,
    *,
    python: str,
    containment: Containment,
    context: LaunchContext | None = None,
) -> Started:
    """Start the attempt's shim, write its launch intent, make its cgroup and hand it the
    job. Raises SpecError (the shim cannot start) or Unavailable (no cgroup) before the
    job has run anything; a shim that cannot be handed its job is killed and reported by
    its poll (`Started.handed` False)."""
    ctx = context or LaunchContext()
    run_dir = spec.run_dir.absolute()
    log_dir = (ctx.log_dir or run_dir).absolute()
    prepare_dirs(run_dir, log_dir, spec.user, spec.checkpoint_dir)
    record = exit_file(log_dir, spec.attempt)
    for stale in (record, stop_file(log_dir, spec.attempt)):
        stale.unlink(missing_ok=True)
    token = spec.launch_token or secrets.token_hex(16)
    cgroups = containment.cgroups
    group = cgroup_name(spec.job_id, spec.attempt, token) if cgroups is not None else ""
    env = job_environment(spec)
    env.update(ctx.extra_env)
    env[TOKEN_ENV] = token
    cwd = spec.cwd
    if cwd is None and spec.user is not None:
        cwd = run_dir / HOME_DIR  # the server's own directory is none of its business
    job = {
        "argv": list(spec.argv),
        "env": env,
        "cwd": str(cwd) if cwd is not None else None,
        "uid": spec.user.uid if spec.user is not None else None,
        "gid": spec.user.gid if spec.user is not None else None,
        "stdout": str(log_dir / STDOUT_LOG),
        "stderr": str(log_dir / STDERR_LOG),
        "log_max_bytes": containment.log_max_bytes,
        **ctx.shim_fields,
    }
    header = f"== attempt {spec.attempt} ==\n".encode()
    # The shim starts first, so that its interpreter's start overlaps the intent and
    # the cgroup: until it is handed the job it runs nothing, and should we die before
    # that, it reads EOF and exits without starting the job. The job's processes, the
    # only ones the intent is for, come after the intent and inside the cgroup.
    read_end, write_end = os.pipe()
    argv = [*shim_command(python), "--exit-file", str(record), "--spec-fd", str(read_end)]
    try:
        with (
            open(log_dir / STDOUT_LOG, "ab", buffering=0) as out,
            open(log_dir / STDERR_LOG, "ab", buffering=0) as err,
        ):
            out.write(header)
            err.write(header)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env={"PATH": DEFAULT_PATH, TOKEN_ENV: token},
                    cwd=run_dir if spec.user is not None else None,
                    start_new_session=True,
                    pass_fds=(read_end,),
                )
            except OSError as e:
                raise SpecError(f"job {spec.job_id}: cannot start the shim {argv[0]}: {e}") from e
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        if ctx.nice is not None:
            with contextlib.suppress(OSError):  # not permitted: it runs at our niceness
                os.setpriority(os.PRIO_PROCESS, proc.pid, ctx.nice)
        # The intent before the job's cgroup and processes: whatever exists after it
        # can be found again by it, and cleaned up.
        write_atomically(
            launch_file(log_dir, spec.attempt),
            {"job_id": spec.job_id, "attempt": spec.attempt, "token": token, "cgroup": group},
        )
        if cgroups is not None:
            devices = gpu_device_rules(
                spec.gpu_indices, containment.devices_dir, containment.base_devices
            )
            try:
                cgroups.create(group, spec.limits, devices)
            except OSError as e:
                with contextlib.suppress(OSError):
                    cgroups.remove(group)
                why = f"job {spec.job_id}: cannot create its cgroup {group}: {e}"
                raise Unavailable(why) from e
    except BaseException:
        abandon(proc)  # never handed a job: nothing of it ran
        os.close(write_end)
        raise
    # Our child's pid stays ours (a zombie at worst) until we reap it.
    ticks = read_start_ticks(proc.pid, zombie_ok=True) or 0
    handed = True
    try:
        if cgroups is not None:
            cgroups.add(group, proc.pid)  # before it has started anything
        with open(write_end, "wb", closefd=False) as pipe:
            pipe.write(marshal.dumps(job))  # the shim reads marshal, not json
    except OSError as e:
        # Not placed, or it died: it never gets the job, and the poll reports it.
        handed = False
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
        if not isinstance(e, BrokenPipeError):
            with contextlib.suppress(OSError), open(log_dir / STDERR_LOG, "a") as f:
                f.write(f"gpupool: could not hand the job to its shim: {e}\n")
    finally:
        os.close(write_end)
    return Started(proc, token, group, record, ticks, handed)


@dataclass(frozen=True)
class AttemptProcesses:
    """Every process of one attempt: its cgroup's members, or (no cgroups) the processes
    carrying its launch token; `pgid` is its shim's process group."""

    pgid: int
    token: str
    cgroup: str
    cgroups: Cgroups | None

    def members(self) -> list[int]:
        if self.cgroup and self.cgroups is not None:
            return self.cgroups.pids(self.cgroup)
        return token_pids(self.token)

    def signal(self, sig: int) -> None:
        """`sig` to the shim's process group and to each process that left it; SIGKILL
        kills every member."""
        with contextlib.suppress(OSError):
            os.killpg(self.pgid, sig)
        if sig == signal.SIGKILL:
            self.kill()
            return
        for pid in self.members() if self.cgroup else ():
            if pgid_of(pid) != self.pgid:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)

    def kill(self) -> None:
        """SIGKILL every member and wait (briefly; a poll looks again) until they are gone."""
        if self.cgroup and self.cgroups is not None:
            self.cgroups.kill(self.cgroup)
            return
        killed = token_pids(self.token)
        for pid in killed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        # A dying process stops showing its environment before it is gone: wait for it
        # so that "ended" means gone.
        deadline = time.monotonic() + 0.2
        while killed and time.monotonic() < deadline:
            killed = [pid for pid in killed if read_start_ticks(pid) is not None]
            if killed:
                time.sleep(0.002)

    def end(self) -> bool:
        """Kill what is left of an attempt whose shim has ended; True once nothing is
        (its cgroup then removed): until then its GPUs are not free."""
        if self.members():
            self.kill()
            if self.members():
                return False
        if self.cgroup and self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.remove(self.cgroup)
        return True
