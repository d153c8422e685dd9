"""The executor port: the contract between the scheduler loop and whatever runs its jobs.

The values that cross it are here too: what to start (`LaunchSpec`, with its `Gang`,
`JobUser` and `Limits`), how to find it again (`Handle`), how it ended (`Exit`, one of
`OUTCOMES`), and `classify`, the one rule that turns how an attempt died and what was
asked of it into an outcome, so every executor and the fake agree.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpupool.errors import SpecError

SUCCEEDED = "succeeded"
FAILED = "failed"
PREEMPTED = "preempted"
KILLED = "killed"
CANCELLED = "cancelled"
OOM = "oom"
CRASHED = "crashed"
LOST = "lost"
OUTCOMES = frozenset({SUCCEEDED, FAILED, PREEMPTED, KILLED, CANCELLED, OOM, CRASHED, LOST})

DEFAULT_GRACE_S = 60.0
"""The grace period between SIGTERM and SIGKILL when the caller names none."""


@dataclass(frozen=True)
class Limits:
    """What one job may use. None: unlimited (as far as gpupool is concerned)."""

    cpu_cores: float | None = None
    mem_mib: int | None = None
    pids: int | None = None

    def over(self, other: Limits) -> Limits:
        """These limits where set, `other`'s elsewhere (a team's over a kind's default)."""
        return Limits(
            self.cpu_cores if self.cpu_cores is not None else other.cpu_cores,
            self.mem_mib if self.mem_mib is not None else other.mem_mib,
            self.pids if self.pids is not None else other.pids,
        )


NO_LIMITS = Limits()


@dataclass(frozen=True)
class JobUser:
    """The unprivileged Unix user a job runs as (its team's)."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class GangMember:
    """One node's part of a job across nodes: its GPU indices there, as the core chose."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Gang:
    """The members of a job across nodes, rank 0 first (rank 0's node hosts MASTER_PORT).
    `grace_s`: how long the other members get between SIGTERM and SIGKILL when one of
    them ends badly, as a preemption would give them."""

    members: tuple[GangMember, ...]
    grace_s: float = DEFAULT_GRACE_S


MULTI_NODE_REFUSED = (
    "this service runs each job on one machine (the local executor), so a job the core "
    "placed over several nodes cannot start here: run `gpupool serve --ray ADDRESS` to run "
    "jobs across nodes as gangs, or ask for at most one node's GPUs"
)


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of one job. `run_dir` belongs to the job and outlives its attempts.
    `user`: run as this user (None: as the server). `limits`: its cgroup's limits."""

    job_id: str
    attempt: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    gpu_indices: tuple[int, ...]
    run_dir: Path
    resume: bool
    cwd: Path | None = None
    user: JobUser | None = None
    limits: Limits = NO_LIMITS
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES as the job must see it, when not the indices: a card's UUID
    for a client of that card's MPS daemon (the daemon renumbers the devices it sees)."""
    gang: Gang | None = None
    """A job the core placed over several nodes: one member process per node, all or none
    (RayExecutor runs it; LocalExecutor, one machine, refuses it). None: one node."""
    checkpoint_dir: Path | None = None
    """Where the job's checkpoints live (GPUPOOL_CHECKPOINT_DIR): in storage every node
    reaches, so that an attempt on another machine finds them. None: `run_dir/checkpoint`."""
    launch_token: str = ""
    """The attempt's launch token when the caller has already recorded it in a launch
    intent (a server whose agent is on another machine does, before asking it to start);
    "": the agent that starts the attempt chooses one."""


def validate(spec: LaunchSpec) -> None:
    """Refuse (SpecError) a spec no executor can start, before anything is started."""
    if not spec.argv or not spec.argv[0]:
        raise SpecError(f"job {spec.job_id}: the command is empty; give the program to run")
    if spec.attempt < 1:
        raise SpecError(f"job {spec.job_id}: attempt must be 1 or more, got {spec.attempt}")
    if spec.cwd is not None and not spec.cwd.is_dir():
        raise SpecError(
            f"job {spec.job_id}: working directory {spec.cwd} does not exist; create it or "
            "submit the job without a working directory"
        )


@dataclass(frozen=True)
class Handle:
    """Enough to find the attempt again after a restart. `start_ticks` (field 22 of
    /proc/<pid>/stat) tells a recycled pid apart from the job. `token` and `cgroup` (from
    the launch intent) find all its processes; pid 0: the shim's pid is not known yet."""

    job_id: str
    attempt: int
    pid: int
    pgid: int
    start_ticks: int
    token: str = ""
    cgroup: str = ""


@dataclass(frozen=True)
class Exit:
    """How an attempt ended. `exit_code`/`signal` are the job command's own when known
    (the shim's when it left no record); `at_s` is the now_s of the poll that saw it."""

    job_id: str
    attempt: int
    outcome: str
    exit_code: int | None
    signal: int | None
    reason: str
    at_s: float
    node: str | None = None
    """The node the attempt was lost on, when not the job's first (a gang member's)."""


class Executor(Protocol):
    """What the scheduler loop needs from whatever runs the jobs: local processes, the
    nodes of a Ray cluster, the simulator's world, or a fake.

    Below properties are assumed of every implementation:

    1. One caller. The scheduler loop calls it from one thread; nothing is thread-safe.
    2. The caller's clock. `now_s` is the loop's clock (Unix seconds in the live service,
       simulated seconds in the simulator); grace deadlines are kept in it, and an
       executor never reads a clock of its own to decide an outcome.
    3. Ends come back as data, once. An attempt's end is an `Exit` from `poll`, never an
       exception: a command that does not exist, a job killed by the kernel, a node that
       died are all outcomes (`OUTCOMES`) with a reason sentence. Each attempt's `Exit` is
       returned by exactly one poll, after which the attempt is no longer watched.
    4. Ended means gone. An attempt is reported ended only once nothing of it is left
       running (its processes, its cgroup, every member of its gang), so its GPUs are free
       when its `Exit` is seen.
    5. Jobs outlive the scheduler. `shutdown` leaves them running; a scheduler started
       later takes them back with `adopt`, or learns from `poll` how they ended.
    6. Errors are raised only for a call that cannot be carried out, as
       `gpupool.errors` types: `SpecError` (the spec is wrong: an empty command, attempt
       < 1, a missing working directory, a gang where `runs_gangs` is False),
       `ConflictError` (the job is already watched here; a resize where `can_resize` is
       False), `NotFoundError` (a stop of a job not watched here), `Unavailable` (it
       cannot start now: no cgroup, a node's launcher did not answer; the caller
       requeues the job).

    Capabilities beyond the protocol (`launch_many`, `expect_launch`, `watch_exits`,
    `read_log`, `remember_node`, `progress`, `isolation`, `node_address`) are optional:
    the loop uses them where an executor has them.

    `node_address(node) -> str` is the IP address at which a process on the node is
    reached from the server's machine (and from clients): the local executor's is the
    server's own node address (`network.node_address`, 127.0.0.1 by default), a Ray
    node's its `NodeManagerAddress`. A service replica listens there (it is told it in
    GPUPOOL_REPLICA_HOST) and is scraped and shown there. It may ask the cluster (a
    remote call) the first time a node is named; SpecError for a node it does not know.
    Without it the loop takes the server's own node address for every node.
    """

    can_resize: bool
    """It can stop a job's processes and relaunch them on other GPUs (elastic resize);
    where False, the loop never calls `resize` and elastic jobs run at their full size."""

    runs_gangs: bool
    """It runs a job the core placed over several nodes as a gang (one member process
    per node, all or none); where False, `launch` refuses such a spec (SpecError,
    MULTI_NODE_REFUSED)."""

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        """Start attempt `spec.attempt` of the job on `spec.gpu_indices` and return once its
        process is started, not once the job has run: it blocks for the start only
        (milliseconds for a local process; up to a launcher's start timeout on Ray). A
        job whose command turns out not to exist still launches; the next poll returns
        outcome "failed" with reason "command not found: X". Raises SpecError,
        ConflictError (already watched: poll its end first) or Unavailable."""
        ...

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        """Ask the job to leave: SIGTERM now (it checkpoints), SIGKILL once `grace_s` has
        passed in the caller's clock. Returns at once, before the job has left; the
        SIGKILL is sent by the first poll at or after `now_s + grace_s`, and the end
        comes back through `poll`: "preempted" if it left within the grace, "killed"
        after the SIGKILL, or how it ended by itself if that came first. Asking again
        only ever brings the deadline forward. A job already ended returns quietly (the
        next poll reports it); one not watched raises NotFoundError."""
        ...

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        """Stop the job's processes as a preemption does (SIGTERM: it checkpoints; grace;
        SIGKILL) so that the service relaunches it on its new GPUs once they exited;
        the exit says "preempted". Only called where `can_resize` is True (else
        ConflictError)."""
        ...

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        """As `preempt`, but the end is "cancelled" (the job is not coming back). A cancel
        during a preemption wins, never the reverse."""
        ...

    def poll(self, now_s: float) -> list[Exit]:
        """The attempts that ended since the last poll, each once, with `at_s` = `now_s`;
        sends the SIGKILLs whose deadlines have passed. Does not wait for anything to
        end: it costs a system call per job locally, and at most one call timeout per
        node on Ray (a node that does not answer is asked again next time; one its
        cluster no longer lists makes its attempts "lost")."""
        ...

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        """Watch an attempt an earlier scheduler started, from the handle it stored and the
        job's run directory. True if that very process still runs: the same pid and start
        time (`Handle.start_ticks`), proved to be this attempt's (locally: a shim whose
        command line names this run directory's exit record, or found by the launch
        intent's cgroup or token when the pid was never stored; on Ray: a node
        launcher's record of it; a gang: every member). Else False, and the next poll
        reports its end: from its exit record when it left one, else "lost". Raises
        ConflictError if the job is already watched."""
        ...

    def handles(self) -> dict[str, Handle]:
        """The attempts watched now and not yet reported ended, by job id: what `preempt`,
        `cancel` and `resize` accept. After `adopt` the handle may be more complete than
        the one given (a pid found by the launch intent)."""
        ...

    def shutdown(self) -> None:
        """Stop watching; the jobs keep running for the next scheduler to adopt."""
        ...


# --------------------------------------------------------------------------- outcomes


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _grace_text(grace_s: float) -> str:
    return f"{grace_s:g} s"


def classify(
    job_id: str,
    attempt: int,
    *,
    exit_code: int | None,
    signal_num: int | None,
    at_s: float,
    stop_kind: str | None = None,
    kill_sent: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    error: str | None = None,
    vanished: bool = False,
) -> Exit:
    """The one place that turns "how it died" plus "what we asked" into an outcome, so the
    live executor and the fake always agree.

    stop_kind is "preempt" or "cancel" once we sent SIGTERM; kill_sent once we sent the
    group SIGKILL. vanished: no exit record and no wait status (node rebooted, or the shim
    was killed while nobody was its parent)."""

    def made(outcome: str, reason: str) -> Exit:
        return Exit(job_id, attempt, outcome, exit_code, signal_num, reason, at_s)

    grace = _grace_text(grace_s)
    stopped = CANCELLED if stop_kind == "cancel" else PREEMPTED
    if kill_sent and (vanished or signal_num == signal.SIGKILL):
        exit_code, signal_num = None, signal.SIGKILL  # ours, even when no one saw it land
        reason = f"killed by SIGKILL after the {grace} grace period"
        if stop_kind == "cancel":
            return made(CANCELLED, reason + " (cancelled)")
        return made(KILLED, reason)
    if vanished:
        return made(
            LOST,
            "the process disappeared without leaving an exit record (the node may have "
            "rebooted); requeue the job, it resumes from its last checkpoint",
        )
    if signal_num is not None:
        ending = f"died of {_signal_name(signal_num)}"
    else:
        ending = f"exited {exit_code}"
    if stop_kind is not None:
        why = "cancellation" if stop_kind == "cancel" else "preemption"
        if signal_num == signal.SIGTERM:
            return made(
                stopped,
                f"ended by the SIGTERM for {why}; the job has no SIGTERM handler, so it saved "
                "no checkpoint on the way out",
            )
        return made(stopped, f"{ending} within the {grace} grace period after SIGTERM for {why}")
    if error is not None:
        return made(FAILED, error)
    if signal_num == signal.SIGKILL:
        return made(
            OOM,
            "killed by SIGKILL that gpupool did not send, usually the kernel's out-of-memory "
            "killer; give the job more memory or make it use less",
        )
    if signal_num is not None:
        return made(CRASHED, ending)
    if exit_code == 0:
        return made(SUCCEEDED, ending)
    return made(FAILED, ending)
