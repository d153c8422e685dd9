"""What the store refuses, before it writes anything: a job or a service the scheduler
could never run (SpecError, naming the field and what to give instead), an unknown
state, a job that is not there, a move the lifecycle does not allow."""

from __future__ import annotations

import math
import re

from gpupool.domain.model import JobKind, check_elastic
from gpupool.errors import IllegalTransition, NotFoundError, SpecError
from gpupool.server.store.rows import NewJob, NewService
from gpupool.server.store.states import KINDS, STATES, TRANSITIONS
from gpupool.sizing.request_json import plan_request_from


def missing_job(job_id: int) -> NotFoundError:
    return NotFoundError(f"job {job_id} does not exist; gpupool ls lists jobs")


def illegal_move(job_id: int, old: str, new: str) -> IllegalTransition:
    allowed = ", ".join(sorted(TRANSITIONS[old])) or "nowhere (it is finished)"
    return IllegalTransition(
        f"job {job_id} cannot go from {old} to {new}; from {old} it may go to {allowed}"
    )


def check_state(state: str) -> None:
    if state not in TRANSITIONS:
        raise SpecError(f"unknown job state {state!r}; states are {', '.join(STATES)}")


def check_job(job: NewJob) -> None:
    """Refuse a spec the scheduler could never run, before anything is written."""
    if not job.name or not job.team:
        raise SpecError("a job needs a name and a team; set both and resubmit")
    if job.kind not in KINDS:
        raise SpecError(f"unknown job kind {job.kind!r}; kinds are {', '.join(KINDS)}")
    if job.gpu_count < 0:
        raise SpecError(f"gpu_count is {job.gpu_count}; ask for 0 or more GPUs")
    if not job.command or not all(isinstance(a, str) for a in job.command):
        raise SpecError("command must be a non-empty list of strings, e.g. ['python', 'train.py']")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in job.env.items()):
        raise SpecError("env must map strings to strings; quote numbers, e.g. {'SEED': '1'}")
    if job.grace_s < 0 or job.max_retries < 0:
        raise SpecError("grace_s and max_retries must not be negative")
    if job.time_limit_s is not None and not 0 < job.time_limit_s < math.inf:
        raise SpecError(f"time_limit_s is {job.time_limit_s}; give a positive number of seconds")
    _check_placement(job)
    _check_sizing(job)
    _check_share(job)
    _check_elastic(job)


def _check_elastic(job: NewJob) -> None:
    """An elastic range (`--gpus 2..4`): whole GPUs of work that may restart."""
    if job.gpu_count_min is None:
        return
    if job.gpu_milli < 1000 or job.gpu_mem_mib is not None or job.sizing is not None:
        raise SpecError(
            "an elastic job (--gpus MIN..MAX) asks for whole GPUs; drop the GPU share, "
            "--gpu-mem or the model sizing"
        )
    check_elastic(job.name, JobKind(job.kind), job.gpu_count_min, job.gpu_count)


def _check_share(job: NewJob) -> None:
    """Part of one GPU: by share (1..1000 thousandths) or by GPU memory, never both."""
    if not 0 < job.gpu_milli <= 1000:
        raise SpecError(f"gpu_milli is {job.gpu_milli}; give a share of one GPU in 1..1000")
    if job.gpu_mem_mib is not None and job.gpu_mem_mib <= 0:
        raise SpecError(f"gpu_mem_mib is {job.gpu_mem_mib}; give a positive amount of memory")
    sharing = job.gpu_milli < 1000 or job.gpu_mem_mib is not None
    if sharing and job.gpu_count != 1:
        raise SpecError(
            f"a share of a GPU is part of one GPU; the job asks for {job.gpu_count} GPUs "
            "(give --gpus 0.25 or --gpu-mem alone, or whole GPUs)"
        )
    if job.gpu_mem_mib is not None and job.gpu_milli < 1000:
        raise SpecError("give a GPU share (--gpus 0.25) or GPU memory (--gpu-mem), not both")


def _check_placement(job: NewJob) -> None:
    """The multi-cluster placement fields: the same rules the API applies (and FedJob needs)."""
    if not (math.isfinite(job.dataset_gb) and job.dataset_gb >= 0):
        raise SpecError(f"dataset_gb is {job.dataset_gb}; give 0 or more gigabytes")
    if job.deadline_at is not None and not (math.isfinite(job.deadline_at) and job.deadline_at > 0):
        raise SpecError(f"deadline_at is {job.deadline_at}; give a Unix time in seconds")
    if job.latency_bound_ms is not None:
        if not (math.isfinite(job.latency_bound_ms) and job.latency_bound_ms > 0):
            raise SpecError(
                f"latency_bound_ms is {job.latency_bound_ms}; give more than 0 milliseconds"
            )
        if job.user_region is None:
            raise SpecError(
                "latency_bound_ms needs user_region (latency from where?); set both or neither"
            )


def _check_sizing(job: NewJob) -> None:
    """The checkpoint size, and the model request by building the planner's PlanRequest
    (a SizingError, which is a SpecError, names the offending field)."""
    gib = job.state_gib_per_gpu
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not math.isfinite(gib):
        raise SpecError(f"state_gib_per_gpu is {gib!r}; give 0 or more GiB per GPU")
    if gib < 0:
        raise SpecError(f"state_gib_per_gpu is {gib}; give 0 or more GiB per GPU")
    if job.sizing is not None:
        plan_request_from(job.sizing)


_PORT_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def check_service(svc: NewService) -> None:
    """Refuse a service the scheduler could never run, before anything is written."""
    if not _SERVICE_NAME.fullmatch(svc.name):
        raise SpecError(
            f"service name {svc.name!r}: use 1-63 lower-case letters, digits and dashes "
            "(e.g. chat-bot)"
        )
    if not svc.team:
        raise SpecError("a service needs a team; pass --team")
    if not svc.command or not all(isinstance(a, str) for a in svc.command):
        raise SpecError("command must be a non-empty list of strings, e.g. ['python', 'serve.py']")
    check_replicas(svc.min_replicas, svc.max_replicas)
    if not svc.slo_p99_ms > 0 or not svc.replica_rps > 0:
        raise SpecError("slo_p99_ms and replica_rps must be positive numbers")
    if not _PORT_ENV.fullmatch(svc.port_env):
        raise SpecError(f"port_env {svc.port_env!r} is not an environment variable name")
    if not 0 < svc.gpu_milli <= 1000:
        raise SpecError(f"gpu_milli is {svc.gpu_milli}; give a share of one GPU in 1..1000")
    if svc.gpu_mem_mib is not None and svc.gpu_mem_mib <= 0:
        raise SpecError(f"gpu_mem_mib is {svc.gpu_mem_mib}; give a positive amount")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in svc.env.items()):
        raise SpecError("env must map strings to strings")
    if svc.grace_s < 0:
        raise SpecError("grace_s must not be negative")


def check_replicas(low: int, high: int) -> None:
    if not 0 <= low <= high or high < 1:
        raise SpecError(
            f"replicas {low}..{high}: give MIN..MAX with 0 <= MIN <= MAX and MAX >= 1 (e.g. 1..8)"
        )
