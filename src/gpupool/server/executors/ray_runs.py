"""The Ray executor's record of each attempt it watches (its runs: the job's process, or
one per gang member) and how their ends are judged: a single run's by `classify`, a gang's
from every member's, once all of them have ended. Pure: nothing here calls Ray."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.ports.executor.base import (
    DEFAULT_GRACE_S,
    LOST,
    SUCCEEDED,
    Exit,
    GangMember,
    Handle,
    classify,
)


def gang_file(run_dir: Path, attempt: int) -> Path:
    """The members of a gang attempt (rank, node, GPUs), for adoption after a restart."""
    return run_dir / f"gang-{attempt}.json"


def read_gang(path: Path) -> list[Any] | None:
    """The members a gang file lists; None when there is none, it is torn, or it lists
    one member (then the job was no gang)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    members = data.get("members") if isinstance(data, dict) else None
    return members if isinstance(members, list) and len(members) > 1 else None


def gang_env(members: Sequence[GangMember], rank: int, addr: str, port: int) -> dict[str, str]:
    """torchrun's variables for member `rank` (one process per node): where rank 0
    listens, how many members there are, which one this is, how many GPUs it has."""
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(members)),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GROUP_RANK": str(rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(len(members[rank].gpu_indices)),
        "GPUPOOL_GANG_NODES": ",".join(m.node for m in members),
    }


@dataclass
class RayRun:
    """One process a node's launcher started: a job, or one member of a gang."""

    key: str
    """Its name in the node's records (`member_key`)."""
    rank: int
    node: str
    launcher: Any
    pid: int
    ticks: int
    record: str
    """The shim's exit record, on the node."""
    log_dir: Path
    """The run's log directory on the scheduler's host (its copy of the logs)."""
    node_log_dir: str = ""
    """Where the node keeps the run's logs when not at `log_dir` (a joined node keeps
    them in its node directory): the scheduler then copies them as they grow."""
    streamed: dict[str, int] = field(default_factory=dict)
    """Bytes of each of the node's logs already copied to `log_dir`."""
    done: bool = False
    vanished: bool = False
    result: Mapping[str, Any] | None = None
    order: int = 0


@dataclass
class RayJob:
    """One attempt the executor watches: its runs and what was asked of it (a stop)."""

    handle: Handle
    runs: list[RayRun]
    """Rank 0 first; more than one: a gang, one member per node."""
    stop_kind: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    deadline_s: float | None = None
    kill_sent: bool = False
    sigterm_at_wall_s: float | None = None
    run_dir: Path | None = None
    gang_stop: str | None = None
    """Why the gang's other members are being stopped: one ended badly or vanished."""
    ended: int = 0

    @property
    def node(self) -> str:
        return self.runs[0].node

    @property
    def gang(self) -> bool:
        return len(self.runs) > 1


def streams(run: RayRun) -> bool:
    """The node keeps the run's logs elsewhere than the scheduler's copy."""
    return bool(run.node_log_dir) and Path(run.node_log_dir) != run.log_dir


def streamed_file(run: RayRun, attempt: int) -> Path:
    """Where the scheduler remembers how much of the run's logs it has copied (so a
    restarted scheduler neither loses nor repeats a byte)."""
    return run.log_dir / f".streamed-{attempt}.json"


VANISHED: Mapping[str, Any] = {"node_lost": True}
"""A run's answer when its node is gone."""


def judge(job: RayJob, ended: Mapping[str, Any] | None, now_s: float, *, vanished: bool) -> Exit:
    """How one run ended, from its launcher's answer (`ended`) and what was asked of the
    job: `classify`'s rule, the shim's exit record first; `vanished`: its node is gone."""
    h = job.handle
    stop_kind, kill_sent = job.stop_kind, job.kill_sent
    code: int | None = None
    sig: int | None = None
    error: str | None = None
    if vanished:
        # The node died: the process is gone with it (machine lost), and even if we
        # sent SIGKILL the node loss is the news; it resumes elsewhere.
        return Exit(
            h.job_id,
            h.attempt,
            "lost",
            None,
            None,
            f"the Ray node of gpupool node {job.node or '?'} died or left the cluster; "
            "requeue the job, it resumes from its last checkpoint",
            now_s,
        )
    assert ended is not None
    code, sig = ended.get("exit_code"), ended.get("signal")
    record = ended.get("record")
    if isinstance(record, dict):
        ended_at = record.get("ended_at")
        sent = job.sigterm_at_wall_s
        if isinstance(ended_at, int | float) and sent is not None and ended_at < sent:
            stop_kind, kill_sent = None, False
        rc, rs, re_ = (record.get(k) for k in ("exit_code", "signal", "error"))
        code = rc if isinstance(rc, int) else None
        sig = rs if isinstance(rs, int) else None
        error = re_ if isinstance(re_, str) else None
    return classify(
        h.job_id,
        h.attempt,
        exit_code=code,
        signal_num=sig,
        at_s=now_s,
        stop_kind=stop_kind,
        kill_sent=kill_sent,
        grace_s=job.grace_s,
        error=error,
    )


def member_exit(job: RayJob, run: RayRun, now_s: float) -> Exit:
    """How one member ended, by the rules of a single job: a stop the scheduler asked
    for counts; the gang's own stop of the others does not."""
    if run.vanished or run.result is None:
        return judge(job, None, now_s, vanished=True)
    stop_kind, kill_sent = job.stop_kind, job.kill_sent
    if stop_kind is None:  # a member ended by itself: judged as it ended
        job.kill_sent = False
    try:
        return judge(job, run.result, now_s, vanished=False)
    finally:
        job.stop_kind, job.kill_sent = stop_kind, kill_sent


def gang_exit(job: RayJob, now_s: float) -> Exit:
    """The gang's one Exit once every member has ended: lost if any member was lost, the
    worst member's end after a stop, else the first bad member's (or rank 0's)."""
    h = job.handle
    n = len(job.runs)
    by_order = sorted(job.runs, key=lambda run: run.order)
    lost = [run for run in by_order if run.vanished]
    if lost:
        run = lost[0]
        return Exit(
            h.job_id,
            h.attempt,
            LOST,
            None,
            None,
            f"gang member rank {run.rank} on node {run.node} was lost (its Ray node died "
            f"or left the cluster); all {n} members were stopped: requeue the job, it "
            "resumes from its last checkpoint with a new gang",
            now_s,
            node=run.node,
        )
    ends = {run.rank: member_exit(job, run, now_s) for run in job.runs}
    if job.stop_kind is not None:  # preempted or cancelled: the worst member's end
        killed = [e for e in ends.values() if e.signal == signal.SIGKILL]
        ex = killed[0] if killed else ends[0]
        return dataclasses.replace(ex, reason=f"{ex.reason} (all {n} members of the gang)")
    if job.gang_stop is not None:
        first = next(run for run in by_order if ends[run.rank].outcome != SUCCEEDED)
        ex = ends[first.rank]
        return dataclasses.replace(
            ex,
            reason=(
                f"gang member rank {first.rank} on node {first.node}: {ex.reason}; the "
                f"other {n - 1} members were stopped (SIGTERM, SIGKILL after "
                f"{job.grace_s:g} s)"
            ),
        )
    return dataclasses.replace(ends[0], reason=f"{ends[0].reason} (all {n} members)")
