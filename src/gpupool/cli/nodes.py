"""`gpupool top|drain|nodes`: the cluster's nodes and GPUs, from a terminal.

`top` redraws one screen (GPUs, live jobs, the scale-out signals) every --interval seconds;
`drain` stops a node taking new jobs; `nodes` lists them. Parsing is cli/parse.py's, the
text cli/render.py's, and --json goes through cli/output.py's emit().
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from gpupool.cli.flags import add_paging_flags
from gpupool.cli.output import emit
from gpupool.cli.parse import page_limit
from gpupool.cli.render import clock, gpu_table, job_table, node_table, printable, signals_line
from gpupool.cli.verbs import HELP
from gpupool.errors import GpupoolError, SpecError

if TYPE_CHECKING:
    from gpupool.client import Client

CLEAR = "\x1b[H\x1b[2J"
TOP_LIMIT = 50


def add_top_parser(sub: Any, conn: argparse.ArgumentParser) -> None:
    """`gpupool top`."""
    p = sub.add_parser("top", parents=[conn], help=HELP["top"])
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    add_paging_flags(p, TOP_LIMIT)
    p.set_defaults(client_handler=cmd_top)


def add_node_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    """`gpupool drain` and `gpupool nodes`."""
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


def cmd_top(client: Client, args: argparse.Namespace) -> int:
    """Redraw the frame every --interval seconds; after the first frame a failed refresh is
    shown in place and retried, so a server restart does not end the view. Waits with the
    client's sleep, which tests replace."""
    if not args.interval > 0:
        raise SpecError("--interval must be more than zero seconds")
    limit = page_limit(args)
    frame = top_frame(client, time.time(), limit)
    if args.once:
        print(frame)
        return 0
    while True:
        sys.stdout.write(CLEAR + frame + "\n")
        sys.stdout.flush()
        client.sleep(args.interval)
        try:
            frame = top_frame(client, time.time(), limit)
        except GpupoolError as exc:
            frame = f"{clock(time.time())}  {exc}\nretrying every {args.interval:g} s"


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
        f"gpupool top  {client.url}  {clock(now)}  "
        f"queue: {queue.get('running', '?')} running, {queue.get('pending', '?')} pending",
        printable(signals_line(sig, now)),
        "",
        gpu_table(cluster.get("nodes") or []),
        "",
        job_table(jobs, now, placement=True) if jobs else "no running or pending jobs",
    ]
    if more:
        lines.append(f"{len(jobs)} jobs shown; more are live: top --limit N or --all")
    return "\n".join(lines)


def cmd_drain(client: Client, args: argparse.Namespace) -> int:
    out = client.drain(args.node, undo=args.undo, reason=args.reason)
    note = "" if out.get("changed", True) else " (it already was)"
    verb = "takes new jobs again" if args.undo else "takes no new jobs"
    return emit(args, out, lambda: f"node {args.node} {verb}: {out.get('state')}{note}")


def cmd_nodes(client: Client, args: argparse.Namespace) -> int:
    nodes = client.cluster().get("nodes") or []
    return emit(args, {"nodes": nodes}, lambda: node_table(nodes))
