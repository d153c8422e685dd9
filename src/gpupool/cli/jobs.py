"""`gpupool submit|ls|show|why|cancel|logs|hold|release|requeue`: a job's life, from a
terminal.

Each command parses its flags (cli/parse.py), asks the server through the client, and
prints with cli/output.py's emit() and cli/render.py's text. `gpupool logs` alone prints
the job's own bytes as they are, like `cat` of the job's output would.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from gpupool.cli.flags import add_paging_flags
from gpupool.cli.output import emit
from gpupool.cli.parse import (
    gpu_request,
    page_limit,
    parse_deadline,
    parse_duration,
    parse_env,
    parse_number,
    parse_priority,
    parse_sizing,
    time_limit,
)
from gpupool.cli.render import job_block, job_table, why_text
from gpupool.cli.verbs import HELP
from gpupool.domain.lifecycle import TERMINAL_NAMES
from gpupool.errors import SpecError
from gpupool.sizing.memory import BYTES_PER_ELEM, OPTIMIZERS, RECOMPUTE
from gpupool.sizing.planner import TASKS
from gpupool.sizing.shapes import SHAPE_KEYS, shape_names

if TYPE_CHECKING:
    from gpupool.client import Client

POLL_S = 0.5
"""Seconds between two reads of a log that `gpupool logs -f` follows."""
KINDS = ("training", "online-inference", "offline-inference", "batch")
SUBMIT_ATTEMPTS = 4
"""Tries of one `gpupool submit` when the answer is lost, all with the same Idempotency-Key."""
LS_LIMIT = 100


def add_job_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """`gpupool submit|ls|show|why|cancel|logs`."""
    p = sub.add_parser(
        "submit",
        parents=[conn, as_json],
        help=HELP["submit"],
        description="Submit a job. Everything after -- is the job's command.",
        epilog="example: gpupool submit --gpus 2 --kind training --checkpoint-every 30m "
        "-- python train.py --lr 3e-4",
    )
    p.add_argument(
        "--gpus",
        help="GPUs the job needs; a fraction below 1 (0.25) asks for part of one GPU, "
        "shared with other jobs; a range (2..4) makes an offline, batch or training job "
        "elastic: it lends GPUs down to the minimum to online work at its peak "
        "(checkpoint, restart on fewer) and grows back after",
    )
    p.add_argument(
        "--gpu-mem",
        help="GPU memory of one shared GPU (e.g. 20GiB, 512MiB): its share is this over "
        "the memory of the card it lands on",
    )
    p.add_argument("--kind", dest="job_kind", choices=KINDS)
    p.add_argument("--team")
    p.add_argument("--priority", help="low, normal, high or an integer")
    p.add_argument("--checkpoint-every", help="how often the job checkpoints (e.g. 30m)")
    p.add_argument("--grace", help="time to stop after SIGTERM before SIGKILL (e.g. 60s)")
    p.add_argument("--gpu-model", help="only run on this GPU model")
    p.add_argument("--name")
    p.add_argument("--max-retries", type=int)
    p.add_argument("--duration", help="expected run time, for backfill (e.g. 2h)")
    p.add_argument(
        "--env", action="extend", nargs="+", default=[], metavar="K=V", help="environment"
    )
    p.add_argument("--cwd", help="working directory on the node")
    p.add_argument(
        "--dataset", metavar="NAME", help="the data location the job reads (for placement)"
    )
    p.add_argument("--dataset-gb", metavar="GB", help="size of that dataset in GB")
    p.add_argument(
        "--deadline",
        metavar="WHEN",
        help="when the job should be done: a Unix time in seconds (e.g. 1767225600), or a "
        "duration from now with units (90s, 30m, 2h, 1h30m, 1d); sent as deadline_at",
    )
    p.add_argument(
        "--user",
        metavar="NAME",
        help="who submits it inside its team (fair share orders a team's queue by its "
        "users' GPU use); default: the token's name",
    )
    p.add_argument(
        "--topology",
        metavar="LEVEL",
        help="a job wider than a node (a gang) runs inside one domain of this topology "
        "level, e.g. rack (a node label key the service's `topology: levels:` names), or "
        "waits for one rather than spread",
    )
    p.add_argument(
        "--topology-preferred",
        metavar="LEVEL",
        help="a gang runs inside one domain of this level when one has room, else anywhere",
    )
    p.add_argument("--user-region", metavar="REGION", help="where the job's users are")
    p.add_argument(
        "--latency-bound-ms",
        metavar="MS",
        help="latency bound to --user-region, for online-inference (needs --user-region)",
    )
    p.add_argument(
        "--checkpoint-gib",
        metavar="GIB",
        help="checkpoint size: GiB of state per GPU the job writes when preempted (and reads "
        "back when resumed); the scheduler prices preemption by it (default 0: vacates at once)",
    )
    p.add_argument(
        "--idempotency-key",
        help="a retry with the same key returns the same job (default: a fresh key per "
        "invocation, reused by its own retries)",
    )
    _add_sizing_flags(p)
    _add_time_flag(p)
    p.add_argument("job_argv", nargs="*", metavar="command", help="the job's command, after --")
    p.set_defaults(client_handler=cmd_submit)

    p = sub.add_parser("ls", parents=[conn, as_json], help=HELP["ls"])
    p.add_argument("--state", help="only jobs in this state (pending, running, ...)")
    p.add_argument("--team", help="only this team's jobs")
    add_paging_flags(p, LS_LIMIT)
    p.add_argument("--oldest-first", action="store_true", help="oldest jobs first")
    p.set_defaults(client_handler=cmd_ls)

    p = sub.add_parser("show", parents=[conn, as_json], help=HELP["show"])
    p.add_argument("id", type=int)
    p.set_defaults(client_handler=cmd_show)

    p = sub.add_parser(
        "why",
        parents=[conn, as_json],
        help=HELP["why"],
    )
    p.add_argument("id", type=int)
    p.set_defaults(client_handler=cmd_why)

    p = sub.add_parser("cancel", parents=[conn, as_json], help=HELP["cancel"])
    p.add_argument("id", type=int)
    p.set_defaults(client_handler=cmd_cancel)

    p = sub.add_parser("logs", parents=[conn], help=HELP["logs"])
    p.add_argument("id", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    p.add_argument("--stderr", action="store_true", help="the job's stderr instead of stdout")
    p.add_argument(
        "--rank",
        type=int,
        default=0,
        help="a job across nodes: this member's output (default 0, the job's own log)",
    )
    p.set_defaults(client_handler=cmd_logs)


def add_hold_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """`gpupool hold`, `release` and `requeue`."""
    p = sub.add_parser("hold", parents=[conn, as_json], help=HELP["hold"])
    p.add_argument("id", type=int)
    p.set_defaults(client_handler=cmd_hold)
    p = sub.add_parser("release", parents=[conn, as_json], help=HELP["release"])
    p.add_argument("id", type=int)
    p.set_defaults(client_handler=cmd_release)
    p = sub.add_parser(
        "requeue",
        parents=[conn, as_json],
        help=HELP["requeue"],
    )
    p.add_argument("id", type=int)
    p.add_argument("--hold", action="store_true", help="and hold it once it has left")
    p.set_defaults(client_handler=cmd_requeue)


def _add_time_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--time",
        metavar="LIMIT",
        help="wall-time limit of one run (e.g. 4h, 90m, 1d): past it the job gets SIGTERM, "
        "its grace, SIGKILL, and fails (default: the server's for its kind, if any)",
    )


def _add_sizing_flags(p: argparse.ArgumentParser) -> None:
    """--model or --shape and the planner's flags, as `gpupool plan` names them."""
    g = p.add_argument_group(
        "sizing by model",
        "Give the job's model (--model or --shape) instead of, or besides, --gpus: the "
        "scheduler then decides per GPU type how many GPUs it needs, as `gpupool plan` sizes "
        "it. The other flags here need --model or --shape; left out, they take the "
        "planner's defaults.",
    )
    model = g.add_mutually_exclusive_group()
    model.add_argument("--model", help=f"a known model: {', '.join(shape_names())}")
    model.add_argument(
        "--shape",
        metavar="K=V,...",
        help="any other model as key=value pairs, as for gpupool plan: "
        f"{', '.join(SHAPE_KEYS)} (layers, hidden, heads required)",
    )
    g.add_argument(
        "--task",
        choices=TASKS,
        help="inference (default) or training; without --kind the job's kind follows it "
        "(offline-inference or training)",
    )
    g.add_argument("--precision", choices=tuple(BYTES_PER_ELEM), help="default bf16")
    g.add_argument("--kv-precision", choices=tuple(BYTES_PER_ELEM), help="default: weights'")
    g.add_argument("--context", type=int, help="inference: tokens per sequence in KV cache")
    g.add_argument("--seq-len", type=int, help="training: tokens per sequence")
    g.add_argument(
        "--batch",
        type=int,
        help="inference: concurrent sequences; training: micro-batch per data-parallel rank",
    )
    g.add_argument("--grad-accum", type=int, help="training: micro-batches per step")
    g.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), help="training")
    g.add_argument("--recompute", choices=RECOMPUTE, help="training")
    g.add_argument("--optimizer", choices=OPTIMIZERS, help="training")
    g.add_argument("--tokens", help="the work: tokens to generate or train on (5e8, 500M, 2B)")
    g.add_argument("--counts", metavar="N,N,...", help="GPU counts to try (default 1,2,4,8)")


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    if not args.job_argv:
        raise SpecError(
            "give the job's command after --, e.g. gpupool submit --gpus 1 -- python train.py"
        )
    spec: dict[str, Any] = {"command": list(args.job_argv)}
    plain = {
        "name": args.name,
        "team": args.team,
        "kind": args.job_kind,
        "gpu_model": args.gpu_model,
        "max_retries": args.max_retries,
        "cwd": args.cwd,
        "dataset": args.dataset,
        "user_region": args.user_region,
        "user": args.user,
        "topology": args.topology,
        "topology_preferred": args.topology_preferred,
    }
    spec.update({k: v for k, v in plain.items() if v is not None})
    spec.update(gpu_request(args.gpus, args.gpu_mem))
    if args.priority is not None:
        spec["priority"] = parse_priority(args.priority)
    if args.checkpoint_every is not None:
        spec["checkpoint_every_s"] = parse_duration(args.checkpoint_every, "--checkpoint-every")
    if args.grace is not None:
        spec["grace_s"] = parse_duration(args.grace, "--grace", allow_zero=True)
    if args.duration is not None:
        spec["duration_s"] = parse_duration(args.duration, "--duration")
    if args.env:
        spec["env"] = parse_env(args.env)
    if args.dataset_gb is not None:
        spec["dataset_gb"] = parse_number(args.dataset_gb, "--dataset-gb", allow_zero=True)
    if args.deadline is not None:
        spec["deadline_at"] = parse_deadline(args.deadline, time.time())
    if args.latency_bound_ms is not None:
        if args.user_region is None:
            raise SpecError(
                "--latency-bound-ms needs --user-region (latency from where?); give both"
            )
        spec["latency_bound_ms"] = parse_number(args.latency_bound_ms, "--latency-bound-ms")
    if args.checkpoint_gib is not None:
        spec["state_gib_per_gpu"] = parse_number(
            args.checkpoint_gib, "--checkpoint-gib", allow_zero=True
        )
    spec.update(time_limit(args))
    sizing = parse_sizing(args)
    if sizing is not None:
        spec["sizing"] = sizing
        if args.job_kind is None:  # as the simulator's model-jobs generator kinds them
            spec["kind"] = "training" if sizing.get("task") == "training" else "offline-inference"
    # one key per invocation: its own retries reuse it, so a lost answer never makes two jobs
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    job = client.submit(spec, key, attempts=SUBMIT_ATTEMPTS)
    return emit(args, job, lambda: f"submitted job {job.get('id')} ({job.get('state', '?')})")


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    """Newest first (--oldest-first to turn it), the newest --limit or --all of them."""
    jobs, more = client.all_jobs(
        state=args.state, team=args.team, limit=page_limit(args), newest_first=not args.oldest_first
    )
    return emit(args, {"jobs": jobs, "more": more}, lambda: _ls_text(args, jobs, more))


def _ls_text(args: argparse.Namespace, jobs: list[dict[str, Any]], more: bool) -> str:
    if not jobs:
        filters = ", ".join(
            f"{k} {v}" for k, v in (("state", args.state), ("team", args.team)) if v
        )
        return f"no jobs{f' ({filters})' if filters else ''}"
    text = job_table(jobs, time.time())
    if more:
        which = "oldest" if args.oldest_first else "newest"
        text += f"\nthe {which} {len(jobs)} jobs shown; more exist: --limit N or --all"
    return text


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.id)
    return emit(args, job, lambda: job_block(job, time.time()))


def cmd_why(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.id)
    fields = {k: job.get(k) for k in ("id", "state", "reason_code", "reason")}
    return emit(args, fields, lambda: why_text(job))


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.cancel(args.id)
    return emit(args, job, lambda: _cancel_text(job))


def _cancel_text(job: dict[str, Any]) -> str:
    if job.get("state") in TERMINAL_NAMES:
        return f"job {job.get('id')} {job.get('state')}"
    return (
        f"job {job.get('id')} is stopping ({job.get('state')}); "
        f"`gpupool show {job.get('id')}` says when it has ended"
    )


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    """Print the log; drain whatever the server has, and with -f wait for more until the job
    has ended and nothing is left (waiting with the client's sleep, which tests replace)."""
    stream = "stderr" if args.stderr else "stdout"
    offset = 0
    while True:
        text, next_offset, state = client.logs(args.id, stream, offset, rank=args.rank)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
        moved, offset = next_offset != offset, next_offset
        if moved:
            continue
        if not args.follow or state in TERMINAL_NAMES:
            return 0
        client.sleep(POLL_S)


def cmd_hold(client: Client, args: argparse.Namespace) -> int:
    job = client.hold(args.id)
    return emit(
        args,
        job,
        lambda: (
            f"job {args.id} is on hold ({job.get('state')}); "
            f"`gpupool release {args.id}` lets it start"
        ),
    )


def cmd_release(client: Client, args: argparse.Namespace) -> int:
    job = client.release(args.id)
    return emit(args, job, lambda: f"job {args.id} released ({job.get('state')})")


def cmd_requeue(client: Client, args: argparse.Namespace) -> int:
    job = client.requeue(args.id, hold=args.hold)
    then = "held once it has left" if args.hold else "back in the queue once it has left"
    return emit(args, job, lambda: f"job {args.id} is stopping with its checkpoint; {then}")
