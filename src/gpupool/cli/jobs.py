"""`gpupool submit|ls|show|why|cancel|logs|top|token|audit|hold|release|requeue|drain|nodes`:
drive a running gpupool server from a terminal.

httpx is imported only when one of these commands runs, so the simulator's commands start
as fast as before. What the server sends (job names, commands, reasons, node names) is
shown with control characters escaped (printable()), so a job named with terminal escapes
cannot paint over anyone's screen; `gpupool logs` alone prints the job's own bytes as they
are, like `cat` of the job's output would.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
import unicodedata
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpupool.cli.plan import parse_count
from gpupool.cli.table import render
from gpupool.cli.verbs import HELP
from gpupool.errors import GpupoolError, SpecError
from gpupool.sizing.memory import BYTES_PER_ELEM, OPTIMIZERS, RECOMPUTE
from gpupool.sizing.planner import TASKS
from gpupool.sizing.shapes import SHAPE_KEYS, shape_names

if TYPE_CHECKING:
    import httpx

    from gpupool.client import Client

# Tests swap these: a fake server transport, and no real waiting between polls.
TRANSPORT: httpx.BaseTransport | None = None
POLL_S = 0.5
sleep: Callable[[float], None] = time.sleep

KINDS = ("training", "online-inference", "offline-inference", "batch")
PRIORITIES = ("low", "normal", "high")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
CLEAR = "\x1b[H\x1b[2J"
SUBMIT_ATTEMPTS = 4
"""Tries of one `gpupool submit` when the answer is lost, all with the same Idempotency-Key."""
LS_LIMIT = 100
TOP_LIMIT = 50
_DRAIN_STATES = ("draining", "drained")

_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))
_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
    r"(?:(\d+(?:\.\d+)?)s)?"
)


_MEM = re.compile(r"(\d+(?:\.\d+)?)\s*(tib|t|gib|g|mib|m)")
_MEM_MIB = {"t": 1024 * 1024, "tib": 1024 * 1024, "g": 1024, "gib": 1024, "m": 1, "mib": 1}


def parse_mem_mib(text: str, what: str = "--gpu-mem") -> int:
    """'20GiB', '20G', '512MiB', '1.5TiB' -> MiB (binary units; rounded up)."""
    match = _MEM.fullmatch(text.strip().lower())
    if match is None:
        raise SpecError(f"{what} {text!r}: give an amount with a binary unit, e.g. 20GiB or 512MiB")
    mib = math.ceil(float(match.group(1)) * _MEM_MIB[match.group(2)])
    if mib <= 0:
        raise SpecError(f"{what} {text!r} must be more than zero")
    return mib


def _gpu_request(gpus: str | None, gpu_mem: str | None) -> dict[str, Any]:
    """--gpus N (whole GPUs), --gpus 2..4 (elastic: 2 to 4 whole GPUs), --gpus 0.25 (part
    of one) or --gpu-mem 20GiB (part of one, by memory) as the API's fields."""
    out: dict[str, Any] = {}
    if gpus is not None and ".." in gpus:
        low, _, high = gpus.partition("..")
        if not (low.strip().isdigit() and high.strip().isdigit()):
            raise SpecError(f"--gpus {gpus!r}: an elastic range is two whole numbers, e.g. 2..4")
        lo, hi = int(low), int(high)
        if not 1 <= lo <= hi:
            raise SpecError(f"--gpus {gpus}: an elastic range needs 1 <= MIN <= MAX, e.g. 2..4")
        if gpu_mem is not None:
            raise SpecError("an elastic job (--gpus MIN..MAX) takes whole GPUs; drop --gpu-mem")
        out["gpus"] = hi
        if lo < hi:
            out["gpus_min"] = lo
        return out
    if gpus is not None:
        try:
            value = float(gpus)
        except ValueError:
            raise SpecError(
                f"--gpus {gpus!r}: give a whole number, or a fraction like 0.25"
            ) from None
        if value != value or value in (math.inf, -math.inf):
            raise SpecError(f"--gpus {gpus!r}: give a whole number, or a fraction like 0.25")
        if value == int(value):  # the server checks the count
            out["gpus"] = int(value)
        elif 0 < value < 1:
            out["gpus"], out["gpu_share"] = 1, value
        else:
            raise SpecError(
                f"--gpus {gpus}: only part of one GPU can be shared; ask for whole GPUs "
                "or for a fraction below 1"
            )
    if gpu_mem is not None:
        if "gpu_share" in out:
            raise SpecError("give --gpus 0.25 or --gpu-mem, not both")
        if out.get("gpus", 1) != 1:
            raise SpecError("--gpu-mem asks for part of one GPU; drop --gpus or give --gpus 1")
        out["gpus"], out["gpu_mem_mib"] = 1, parse_mem_mib(gpu_mem)
    return out


def parse_duration(text: str, what: str = "duration", allow_zero: bool = False) -> float:
    """'45s', '30m', '2h', '1h30m', '1d' or plain seconds -> seconds.

    Units go largest first, each at most once, so a typo like '30m1h' is caught rather than
    guessed at.
    """
    raw = text.strip().lower()
    value: float | None = None
    try:
        value = float(raw)
    except ValueError:
        match = _DURATION.fullmatch(raw)
        if raw and match:
            value = sum(float(n) * f for n, (_, f) in zip(match.groups(), _UNITS, strict=True) if n)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        raise SpecError(
            f"{what} {text!r}: use a number with d, h, m or s (45s, 30m, 2h, 1h30m) or seconds"
        )
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"{what} {text!r} must be {'zero or ' if allow_zero else ''}more than zero")
    return value


def parse_number(text: str, what: str, allow_zero: bool = False) -> float:
    """A finite number more than zero (or zero too, with allow_zero)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SpecError(f"{what} {text!r}: give a number, e.g. {what} 12.5")
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"{what} {text!r} must be {'zero or ' if allow_zero else ''}more than zero")
    return value


def parse_deadline(text: str, now: float) -> float:
    """--deadline -> deadline_at: a plain number is an absolute Unix time in seconds, which
    must lie ahead; a duration with units (90s, 30m, 2h, 1h30m, 1d) counts from `now`."""
    raw = text.strip().lower()
    try:
        at = float(raw)
    except ValueError:
        return now + parse_duration(text, "--deadline")
    if not math.isfinite(at):
        raise SpecError(f"--deadline {text!r}: give a Unix time in seconds or a duration like 2h")
    if at <= now:
        raise SpecError(
            f"--deadline {text!r} is a Unix time that has passed; for a time from now give "
            f"units, e.g. --deadline {_plain(at)}s"
        )
    return at


def _plain(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def parse_priority(text: str) -> int | str:
    """'low', 'normal', 'high' go to the server as names; anything else must be an integer."""
    if text.lower() in PRIORITIES:
        return text.lower()
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"--priority {text!r}: use low, normal, high or an integer") from None


def parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise SpecError(
                f"--env {pair!r}: use KEY=VALUE; put the job's command after --, "
                "e.g. gpupool submit --env A=1 -- python train.py"
            )
        env[key] = value
    return env


def add_client_parsers(sub: Any) -> None:
    """Add the commands that talk to a gpupool server to the top-level subparsers."""
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument(
        "--url", help="server URL (default: GPUPOOL_URL, config file, or http://127.0.0.1:8642)"
    )
    conn.add_argument("--token", help="API token (default: GPUPOOL_TOKEN or the config file)")
    conn.add_argument(
        "--ca-cert",
        metavar="FILE",
        help="for an https URL: the CA certificate (PEM) to trust (default: GPUPOOL_CA_CERT, "
        "the config file's ca_cert, else the system's trust store)",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the server's JSON")

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
    _add_paging_flags(p, LS_LIMIT)
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

    p = sub.add_parser("top", parents=[conn], help=HELP["top"])
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    _add_paging_flags(p, TOP_LIMIT)
    p.set_defaults(client_handler=cmd_top)
    add_credential_parsers(sub, conn, as_json)
    from gpupool.cli.learn import add_learn_parser

    add_learn_parser(sub, conn, as_json)
    _add_lifecycle_parsers(sub, conn, as_json)
    from gpupool.cli.services import add_service_parsers

    add_service_parsers(sub, conn, as_json)


def _add_paging_flags(p: argparse.ArgumentParser, default: int) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--limit",
        type=int,
        default=default,
        metavar="N",
        help=f"show the newest N jobs ({default})",
    )
    g.add_argument("--all", action="store_true", help="show every job, page by page")


def add_credential_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """`gpupool token create|ls|revoke` and `gpupool audit` (admin tokens)."""
    p = sub.add_parser("token", help=HELP["token"])
    tsub = p.add_subparsers(dest="token_command", metavar="{create,ls,revoke}", required=True)
    c = tsub.add_parser(
        "create",
        parents=[conn, as_json],
        help="make a token and print it once",
        epilog="examples: gpupool token create ci-nlp --team nlp --expires 30d; "
        "gpupool token create grafana --read-only; gpupool token create ops --admin",
    )
    c.add_argument("name", help="who or what will use it (letters, digits, _ . -)")
    role = c.add_mutually_exclusive_group(required=True)
    role.add_argument("--team", help="a member of this team: acts for its jobs only")
    role.add_argument("--admin", action="store_true", help="sees and does everything")
    role.add_argument(
        "--read-only",
        action="store_true",
        help="sees the queue and the cluster, changes nothing, reads no logs",
    )
    c.add_argument("--expires", metavar="DURATION", help="stops working after this (30d, 12h)")
    c.set_defaults(client_handler=cmd_token_create)
    ls = tsub.add_parser("ls", parents=[conn, as_json], help="list tokens (never the secrets)")
    ls.set_defaults(client_handler=cmd_token_ls)
    r = tsub.add_parser("revoke", parents=[conn, as_json], help="revoke a token at once")
    r.add_argument("ref", metavar="NAME|ID")
    r.set_defaults(client_handler=cmd_token_revoke)

    a = sub.add_parser(
        "audit",
        parents=[conn, as_json],
        help=HELP["audit"],
        description="The audit trail, newest first: token changes, every request that "
        "changed something or was refused, admin reads of tokens and of the trail.",
    )
    a.add_argument("--limit", type=int, default=100, metavar="N", help="newest N rows (100)")
    a.add_argument("--since", metavar="DURATION", help="only this recent (e.g. 1d, 2h)")
    a.add_argument("--by", dest="audit_token", metavar="NAME", help="only the rows of this token")
    a.set_defaults(client_handler=cmd_audit)


def _add_time_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--time",
        metavar="LIMIT",
        help="wall-time limit of one run (e.g. 4h, 90m, 1d): past it the job gets SIGTERM, "
        "its grace, SIGKILL, and fails (default: the server's for its kind, if any)",
    )


def _time_limit(args: argparse.Namespace) -> dict[str, Any]:
    """The submit fields --time gives."""
    if getattr(args, "time", None) is None:
        return {}
    return {"time_limit_s": parse_duration(args.time, "--time")}


def _add_lifecycle_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """hold, release, requeue, drain and nodes."""
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
    p = sub.add_parser(
        "drain",
        parents=[conn, as_json],
        help=HELP["drain"],
    )
    p.add_argument("node", help="the node's name, as `gpupool nodes` lists it")
    p.add_argument("--undo", action="store_true", help="let the node take new jobs again")
    p.add_argument("--reason", default="", help="why (kept in the events)")
    p.set_defaults(client_handler=cmd_drain)
    p = sub.add_parser("nodes", parents=[conn, as_json], help=HELP["nodes"])
    p.set_defaults(client_handler=cmd_nodes)


def cmd_hold(client: Client, args: argparse.Namespace) -> int:
    job = client.hold(args.id)
    if args.json:
        _print_json(job)
    else:
        state = job.get("state")
        print(f"job {args.id} is on hold ({state}); `gpupool release {args.id}` lets it start")
    return 0


def cmd_release(client: Client, args: argparse.Namespace) -> int:
    job = client.release(args.id)
    if args.json:
        _print_json(job)
    else:
        print(f"job {args.id} released ({job.get('state')})")
    return 0


def cmd_requeue(client: Client, args: argparse.Namespace) -> int:
    job = client.requeue(args.id, hold=args.hold)
    if args.json:
        _print_json(job)
    else:
        then = "held once it has left" if args.hold else "back in the queue once it has left"
        print(f"job {args.id} is stopping with its checkpoint; {then}")
    return 0


def cmd_drain(client: Client, args: argparse.Namespace) -> int:
    out = client.drain(args.node, undo=args.undo, reason=args.reason)
    if args.json:
        _print_json(out)
    else:
        note = "" if out.get("changed", True) else " (it already was)"
        verb = "takes new jobs again" if args.undo else "takes no new jobs"
        print(f"node {args.node} {verb}: {out.get('state')}{note}")
    return 0


def cmd_nodes(client: Client, args: argparse.Namespace) -> int:
    nodes = client.cluster().get("nodes") or []
    if args.json:
        _print_json({"nodes": nodes})
        return 0
    rows = [
        [
            n.get("name", "?"),
            n.get("gpu_model") or "-",
            n.get("site") or "-",
            len(n.get("gpus") or []),
            sum(g.get("job_id") is not None for g in n.get("gpus") or []),
            n.get("state", "?"),
        ]
        for n in nodes
    ]
    print(render(["node", "model", "site", "GPUs", "busy", "state"], rows) if rows else "no nodes")
    return 0


SIZING_FLAGS = (
    "task",
    "precision",
    "kv_precision",
    "context",
    "seq_len",
    "batch",
    "grad_accum",
    "zero_stage",
    "recompute",
    "optimizer",
    "tokens",
    "counts",
)
"""The submit flags (dests) that go into the job's sizing, besides --model / --shape."""


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


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def parse_sizing(args: argparse.Namespace) -> dict[str, Any] | None:
    """The job's sizing from --model / --shape and the planner's flags (None without a
    model), checked as the server will check it, so a mistake is refused before sending."""
    given = {k: getattr(args, k) for k in SIZING_FLAGS if getattr(args, k) is not None}
    if args.model is None and args.shape is None:
        if given:
            raise SpecError(
                f"{_flag(next(iter(given)))} sizes a job by its model: give --model (or "
                "--shape) too, e.g. gpupool submit --model llama-3-8b --batch 8 -- python serve.py"
            )
        return None
    from gpupool.sizing.request_json import SHAPE_FIELDS, SizingError, plan_request_from
    from gpupool.sizing.shapes import get_shape, parse_shape

    sizing: dict[str, Any] = {}
    if args.model is not None:
        sizing["model"] = get_shape(args.model).name  # the name as the server knows it
    else:
        shape = parse_shape(args.shape)
        sizing["shape"] = {k: getattr(shape, k) for k in SHAPE_FIELDS}
    sizing.update(given)
    if args.tokens is not None:
        sizing["tokens"] = parse_count(args.tokens, "--tokens")
    if args.counts is not None:
        sizing["counts"] = parse_counts(args.counts)
    try:
        plan_request_from(sizing)
    except SizingError as err:
        where = err.loc[0] if err.loc else "model"
        flag = "--shape" if where == "shape" else _flag(where)
        raise SpecError(f"{flag}: {err.reason}") from None
    return sizing


def parse_counts(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]."""
    try:
        counts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise SpecError(f"--counts {text!r}: use whole numbers, e.g. 1,2,4,8") from None
    if not counts or min(counts) < 1:
        raise SpecError(f"--counts {text!r}: counts must be 1 or more")
    return counts


def run_client(args: argparse.Namespace) -> int | None:
    """Run a client command; None when `args` is some other command."""
    handler: Callable[[Client, argparse.Namespace], int] | None = getattr(
        args, "client_handler", None
    )
    if handler is None:
        return None
    from gpupool.client import Client, ca_cert_setting, client_settings

    url, token = client_settings(args.url, args.token)
    ca_cert = ca_cert_setting(args.ca_cert) if url.startswith("https://") else None
    with Client(url, token, transport=TRANSPORT, ca_cert=ca_cert, sleep=sleep) as client:
        return handler(client, args)


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
    }
    spec.update({k: v for k, v in plain.items() if v is not None})
    spec.update(_gpu_request(args.gpus, args.gpu_mem))
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
    spec.update(_time_limit(args))
    sizing = parse_sizing(args)
    if sizing is not None:
        spec["sizing"] = sizing
        if args.job_kind is None:  # as the simulator's model-jobs generator kinds them
            spec["kind"] = "training" if sizing.get("task") == "training" else "offline-inference"
    # one key per invocation: its own retries reuse it, so a lost answer never makes two jobs
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    job = client.submit(spec, key, attempts=SUBMIT_ATTEMPTS)
    if args.json:
        _print_json(job)
    else:
        print(f"submitted job {job.get('id')} ({job.get('state', '?')})")
    return 0


def _limit(args: argparse.Namespace) -> int | None:
    if args.all:
        return None
    if args.limit < 1:
        raise SpecError(f"--limit {args.limit}: show at least 1 job, or --all")
    return int(args.limit)


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    """Newest first (--oldest-first to turn it), the newest --limit or --all of them."""
    jobs, more = client.all_jobs(
        state=args.state, team=args.team, limit=_limit(args), newest_first=not args.oldest_first
    )
    if args.json:
        _print_json({"jobs": jobs, "more": more})
        return 0
    if not jobs:
        filters = ", ".join(
            f"{k} {v}" for k, v in (("state", args.state), ("team", args.team)) if v
        )
        print(f"no jobs{f' ({filters})' if filters else ''}")
        return 0
    print(job_table(jobs, time.time()))
    if more:
        which = "oldest" if args.oldest_first else "newest"
        print(f"the {which} {len(jobs)} jobs shown; more exist: --limit N or --all")
    return 0


def cmd_token_create(client: Client, args: argparse.Namespace) -> int:
    role = "admin" if args.admin else "read-only" if args.read_only else "team"
    expires = None if args.expires is None else parse_duration(args.expires, "--expires")
    made = client.create_token(args.name, args.team, role, expires)
    if args.json:
        _print_json(made)
        return 0
    scope = f"team {made.get('team')}" if made.get("role") == "team" else made.get("role")
    until = made.get("expires_at")
    print(
        f"token {printable(str(made.get('name')))} (id {made.get('id')}) for {scope}, "
        + ("never expires" if until is None else f"expires {_stamp(until)}")
    )
    print(f"  {made.get('token')}")
    print("shown once: store it now (export GPUPOOL_TOKEN=... or the config file's token:)")
    return 0


def cmd_token_ls(client: Client, args: argparse.Namespace) -> int:
    tokens = client.tokens()
    if args.json:
        _print_json({"tokens": tokens})
        return 0
    if not tokens:
        print("no tokens")
        return 0
    rows = [
        [
            t.get("id", "?"),
            printable(str(t.get("name") or "-")),
            t.get("role") or "-",
            printable(str(t.get("team") or "-")),
            t.get("state") or "-",
            _stamp(t.get("created_at")),
            "never" if t.get("expires_at") is None else _stamp(t.get("expires_at")),
            printable(str(t.get("created_by") or "-")),
        ]
        for t in tokens
    ]
    headers = ["id", "name", "role", "team", "state", "created", "expires", "by"]
    print(render(headers, rows))
    return 0


def cmd_token_revoke(client: Client, args: argparse.Namespace) -> int:
    gone = client.revoke_token(args.ref)
    if args.json:
        _print_json(gone)
    else:
        print(f"token {printable(str(gone.get('name')))} (id {gone.get('id')}) revoked")
    return 0


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise SpecError(f"--limit {args.limit}: ask for at least 1 row")
    since = None if args.since is None else time.time() - parse_duration(args.since, "--since")
    rows = client.audit(limit=args.limit, since=since, token=args.audit_token)
    if args.json:
        _print_json({"audit": rows})
        return 0
    if not rows:
        print("no audit rows")
        return 0
    table = [
        [
            r.get("id", "?"),
            _stamp(r.get("at_s")),
            printable(str(r.get("token") or "-")),
            printable(_who(r)),
            printable(str(r.get("action") or "-")),
            printable(f"{r.get('method') or ''} {r.get('path') or ''}".strip() or "-"),
            "-" if r.get("status") is None else r["status"],
            printable(str(r.get("client") or "-")),
            _cut(printable(str(r.get("detail") or "")), 60),
        ]
        for r in rows
    ]
    headers = ["id", "at", "token", "role", "action", "request", "status", "from", "detail"]
    print(render(headers, table))
    return 0


def _who(r: dict[str, Any]) -> str:
    role = r.get("role")
    if role is None:
        return "-"
    return f"team {r.get('team')}" if role == "team" else str(role)


def _stamp(at: Any) -> str:
    if not isinstance(at, int | float):
        return "-"
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.id)
    if args.json:
        _print_json(job)
    else:
        print(job_block(job, time.time()))
    return 0


def why_text(j: dict[str, Any]) -> str:
    """`gpupool why`: the job's state, its reason code and the sentence."""
    job_id, state = j.get("id", "?"), str(j.get("state", "?"))
    code = str(j.get("reason_code") or "")
    reason = str(j.get("reason") or "")
    sentence = reason[len(code) + 2 :] if code and reason.startswith(f"{code}: ") else reason
    if code:
        head = printable(f"job {job_id} {state}: {code}")
        return f"{head}\n  {printable(sentence)}" if sentence else head
    if state in ("pending", "suspended"):
        return printable(f"job {job_id} {state}: {sentence or 'no reason given yet'}")
    return printable(f"job {job_id} is {state}; nothing holds it back ({sentence or '-'})")


def cmd_why(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.id)
    if args.json:
        _print_json({k: job.get(k) for k in ("id", "state", "reason_code", "reason")})
    else:
        print(why_text(job))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.cancel(args.id)
    if args.json:
        _print_json(job)
    elif job.get("state") in TERMINAL:
        print(f"job {job.get('id')} {job.get('state')}")
    else:
        print(
            f"job {job.get('id')} is stopping ({job.get('state')}); "
            f"`gpupool show {job.get('id')}` says when it has ended"
        )
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    """Print the log; drain whatever the server has, and with -f wait for more until the job
    has ended and nothing is left."""
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
        if not args.follow or state in TERMINAL:
            return 0
        sleep(POLL_S)


def cmd_top(client: Client, args: argparse.Namespace) -> int:
    """Redraw the frame every --interval seconds; after the first frame a failed refresh is
    shown in place and retried, so a server restart does not end the view."""
    if not args.interval > 0:
        raise SpecError("--interval must be more than zero seconds")
    limit = _limit(args)
    frame = top_frame(client, time.time(), limit)
    if args.once:
        print(frame)
        return 0
    while True:
        sys.stdout.write(CLEAR + frame + "\n")
        sys.stdout.flush()
        sleep(args.interval)
        try:
            frame = top_frame(client, time.time(), limit)
        except GpupoolError as exc:
            frame = f"{_clock(time.time())}  {exc}\nretrying every {args.interval:g} s"


def top_frame(client: Client, now: float, limit: int | None = TOP_LIMIT) -> str:
    """One screen: the header with queue and signals, the GPU table, the live jobs
    (running, then suspended, then pending, each newest first; `limit` in all, None: all)."""
    cluster = client.cluster()
    jobs: list[dict[str, Any]] = []
    more = False
    for state in ("running", "suspended", "pending"):
        left = None if limit is None else limit - len(jobs)
        if left is not None and left <= 0:
            more = more or bool(client.jobs(state=state, limit=1))
            continue
        got, over = client.all_jobs(state=state, limit=left)
        jobs += got
        more = more or over
    queue = cluster.get("queue") or {}
    sig = cluster.get("signals") or {}
    lines = [
        f"gpupool top  {client.url}  {_clock(now)}  "
        f"queue: {queue.get('running', '?')} running, {queue.get('pending', '?')} pending",
        printable(_signals_line(sig, now)),
        "",
        gpu_table(cluster.get("nodes") or []),
        "",
        job_table(jobs, now, placement=True) if jobs else "no running or pending jobs",
    ]
    if more:
        lines.append(f"{len(jobs)} jobs shown; more are live: top --limit N or --all")
    return "\n".join(lines)


def _signals_line(sig: dict[str, Any], now: float) -> str:
    reclaimable = sig.get("reclaimable") or []
    parts = [
        f"scale-out: {'YES' if sig.get('scale_out') else 'no'}",
        f"mean util {_num(sig.get('mean_util_pct'), '{:.1f}%')} over "
        f"{_num(sig.get('window_s'), '{:g}')} s",
        "reclaimable GPUs: " + (", ".join(str(r) for r in reclaimable) or "none"),
    ]
    at = sig.get("evaluated_at")
    parts.append("not evaluated yet" if at is None else f"evaluated {_span(now - at)} ago")
    return "signals: " + "; ".join(parts)


def gpu_table(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for node in nodes:
        for g in node.get("gpus") or []:
            healthy = g.get("healthy", True) and node.get("healthy", True)
            rows.append(
                [
                    node.get("name", "?"),
                    g.get("index", "?"),
                    g.get("model") or node.get("gpu_model") or "-",
                    _num(g.get("util_pct"), "{:.0f}"),
                    _memory(g.get("mem_used_mib"), g.get("mem_total_mib")),
                    _num(g.get("temp_c"), "{:.0f}"),
                    f"{_num(g.get('power_w'), '{:.0f}')}/{_num(g.get('power_limit_w'), '{:.0f}')}",
                    "-" if g.get("job_id") is None else g["job_id"],
                    "yes" if g.get("reclaimable") else "",
                    ("ok" if healthy else (g.get("problem") or "unhealthy"))
                    + (f" ({node['state']})" if node.get("state") in _DRAIN_STATES else ""),
                ]
            )
            rows[-1] = _safe(rows[-1])
    if not rows:
        return "no GPUs reported"
    headers = ["node", "gpu", "model", "util %", "mem GiB", "temp C", "power W", "job"]
    return render([*headers, "reclaim", "health"], rows)


def job_table(jobs: list[dict[str, Any]], now: float, placement: bool = False) -> str:
    """The ls table; top adds where each job runs."""
    headers = ["id", "name", "team", "kind", "prio", "GPUs", "state", "age/runtime", "reason"]
    if placement:
        headers.insert(6, "on")
    rows = []
    for j in jobs:
        state = j.get("state", "?") + (" (preempting)" if j.get("preempting") else "")
        state += " (held)" if j.get("held") else ""
        row: list[object] = [
            j.get("id", "?"),
            printable(str(j.get("name") or "-")),
            j.get("team") or "-",
            j.get("kind") or "-",
            j.get("priority", "-"),
            _gpus(j),
            state,
            _age(j, now),
            _cut(printable(str(j.get("reason_code") or j.get("reason") or "")), 48),
        ]
        if placement:
            row.insert(6, _cut(printable(_placement(j) or "-"), 32))
        rows.append(_safe(row))
    return render(headers, rows)


def job_block(j: dict[str, Any], now: float) -> str:
    """`gpupool show` without --json: one fact a line."""
    state = j.get("state", "?") + (", preempting" if j.get("preempting") else "")
    cp = j.get("checkpoint_every_s")
    facts = [
        ("team", j.get("team") or "-"),
        ("kind", j.get("kind") or "-"),
        ("priority", j.get("priority", "-")),
        ("GPUs", _gpus(j) + (f" on {_placement(j)}" if j.get("gpus") else "")),
        ("command", shlex.join(str(a) for a in j.get("command") or [])),
        ("attempts", f"{j.get('attempts', 0)} (preempted {j.get('preemptions', 0)} times)"),
        ("submitted", _when(j.get("submitted_at"), now)),
        ("started", _when(j.get("started_at"), now)),
        ("ended", _when(j.get("ended_at"), now)),
        ("exit code", "-" if j.get("exit_code") is None else j["exit_code"]),
        ("checkpoint", "never" if cp is None else f"every {_span(cp)}"),
        *_sizing_facts(j),
        *type_facts(j),
        *_lifecycle_facts(j),
        ("grace", _span(j["grace_s"]) if j.get("grace_s") is not None else "-"),
        ("reason", j.get("reason") or "-"),
    ]
    facts += _placement_facts(j, now)
    lines = [
        f"job {j.get('id', '?')}  {printable(str(j.get('name') or '-'))}  ({printable(state)})"
    ]
    lines += [f"  {k:<12}{printable(str(v))}" for k, v in facts]
    return "\n".join(lines)


def _placement_facts(j: dict[str, Any], now: float) -> list[tuple[str, object]]:
    """What multi-cluster placement knows of the job; only the fields that are set."""
    facts: list[tuple[str, object]] = []
    if j.get("dataset") or j.get("dataset_gb"):
        facts.append(("dataset", f"{j.get('dataset') or '-'} ({j.get('dataset_gb') or 0:g} GB)"))
    if j.get("deadline_at") is not None:
        at = j["deadline_at"]
        stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
        left = f"in {_span(at - now)}" if at > now else f"{_span(now - at)} ago"
        facts.append(("deadline", f"{stamp} ({left})"))
    if j.get("user_region") is not None:
        facts.append(("users in", j["user_region"]))
    if j.get("latency_bound_ms") is not None:
        facts.append(("latency", f"within {j['latency_bound_ms']:g} ms"))
    return facts


def _lifecycle_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The time limit and the hold; only those that are set."""
    facts: list[tuple[str, object]] = []
    if j.get("time_limit_s") is not None:
        facts.append(("time limit", f"{_span(j['time_limit_s'])} per run"))
    if j.get("held"):
        facts.append(("held", f"yes: `gpupool release {j.get('id')}` lets it start"))
    return facts


def _sizing_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The checkpoint size and the model the job is sized by; only those that are set."""
    facts: list[tuple[str, object]] = []
    gib = j.get("state_gib_per_gpu")
    if gib:
        facts.append(("ckpt size", f"{gib:g} GiB per GPU (written when preempted)"))
    sizing = j.get("sizing")
    if isinstance(sizing, dict):
        facts.append(("sized by", sizing_line(sizing)))
    return facts


def type_facts(j: dict[str, Any]) -> list[tuple[str, object]]:
    """The GPU type a running job got and why, and a sized job's plan, from the reason
    the service gave it when it started ('started: GPU type H100: ...; plan 4 x ...')."""
    reason = str(j.get("reason") or "")
    head, _, note = reason.partition(": ")
    if head not in ("started", "resumed") or not note:
        return []
    facts: list[tuple[str, object]] = []
    if note.startswith("plan "):
        why, plan = "", note.removeprefix("plan ")
    else:
        why, _, plan = note.partition("; plan ")
    if why.startswith("GPU type "):
        facts.append(("GPU type", why.removeprefix("GPU type ")))
    if plan:
        facts.append(("plan", plan))
    return facts


def sizing_line(s: dict[str, Any]) -> str:
    """'llama-3-8b inference bf16, context 2048, batch 8, 1,000,000 tokens'."""
    raw = s.get("shape")
    shape: dict[str, Any] = raw if isinstance(raw, dict) else {}
    model = s.get("model") or shape.get("name") or "custom shape"
    task = s.get("task") or "inference"
    parts = [f"{model} {task} {s.get('precision') or 'bf16'}"]
    if task == "training":
        parts.append(
            f"seq {s.get('seq_len', '-')} x micro-batch {s.get('batch', '-')} "
            f"x accum {s.get('grad_accum', '-')}"
        )
    else:
        parts.append(f"context {s.get('context', '-')}, batch {s.get('batch', '-')}")
    if isinstance(s.get("tokens"), int | float):
        parts.append(f"{s['tokens']:,.0f} tokens")
    if isinstance(s.get("deadline_s"), int | float):
        parts.append(f"within {_span(s['deadline_s'])}")
    return ", ".join(parts)


def _gpus(j: dict[str, Any]) -> str:
    # a sized job holds the count the core chose for its type, not the one submitted
    count = len(j["gpus"]) if j.get("gpus") else j.get("gpu_count", "?")
    model = j.get("gpu_model") or j.get("gpu_type")
    mem = j.get("gpu_mem_mib")
    if mem is not None:  # part of one GPU, by memory
        return f"{_mib(mem)} of {model or 'one GPU'}"
    milli = j.get("gpu_milli", 1000)
    if isinstance(milli, int) and 0 < milli < 1000:  # part of one GPU, by share
        share = f"{milli / 1000:g}"
        return f"{share} of {model}" if model else share
    low = j.get("gpu_count_min")
    if low is not None:  # elastic: what it holds now, of its range
        count = f"{count} (elastic {low}..{j.get('gpu_count', '?')})"
    return f"{count} x {j['gpu_model']}" if j.get("gpu_model") else str(count)


def _mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib / 1024:.1f}GiB" if mib >= 1024 else f"{mib}MiB"


def _placement(j: dict[str, Any]) -> str:
    return ", ".join(f"{g.get('node')}:{g.get('index')}" for g in j.get("gpus") or [])


def _age(j: dict[str, Any], now: float) -> str:
    """Time waiting for queued jobs, time running for running ones, run time for ended ones."""
    state, start, end = j.get("state"), j.get("started_at"), j.get("ended_at")
    if state in ("pending", "suspended"):
        since = j.get("submitted_at")
        return "-" if since is None else _span(now - since)
    if start is None:
        return "-"
    return _span((end if end is not None else now) - start)


def _span(seconds: float) -> str:
    """Compact duration: 42s, 5m07s, 3h02m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} ({_span(now - at)} ago)"


def _clock(now: float) -> str:
    return datetime.fromtimestamp(now).strftime("%H:%M:%S")


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _memory(used_mib: Any, total_mib: Any) -> str:
    used = "-" if used_mib is None else f"{used_mib / 1024:.1f}"
    total = "-" if total_mib is None else f"{total_mib / 1024:.1f}"
    return f"{used}/{total}"


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Controls (C0, DEL, C1: ESC starts every terminal escape), format characters (bidi
overrides, zero-width ones), lone surrogates and line/paragraph separators."""


def printable(text: str) -> str:
    """text with every control or format character written as an escape (\\x1b, \\n,
    \\u202e), so it shows as what it is instead of acting on the terminal."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif unicodedata.category(ch) in _UNPRINTABLE:
            n = ord(ch)
            out.append(
                f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def _safe(row: list[object]) -> list[object]:
    """A table row with its text cells made printable()."""
    return [printable(c) if isinstance(c, str) else c for c in row]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _print_json(payload: object) -> None:
    print(json.dumps(payload, indent=2))
