"""`gpupool service create / ls / show / scale / delete`: online services on a server.

Parsing is cli/parse.py's, the text cli/render.py's, and --json goes through
cli/output.py's emit().
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gpupool.cli.output import emit
from gpupool.cli.parse import parse_env, parse_mem_mib, parse_priority, parse_replicas
from gpupool.cli.render import service_table, service_text
from gpupool.cli.verbs import HELP
from gpupool.errors import SpecError

if TYPE_CHECKING:
    from gpupool.client import Client


def add_service_parsers(sub: Any, conn: argparse.ArgumentParser, as_json: Any) -> None:
    p = sub.add_parser(
        "service",
        help=HELP["service"],
        description="An online service: the scheduler starts, places and stops its replicas "
        "(jobs of kind online-inference), more when load or p99 latency rises, fewer when "
        "demand falls. Each replica is told its node's address in $GPUPOOL_REPLICA_HOST and "
        "a port in $PORT (--port-env), listens there and serves Prometheus metrics at "
        "/metrics (docs/services.md).",
    )
    ssub = p.add_subparsers(
        dest="service_command", metavar="{create,ls,show,scale,delete}", required=True
    )
    c = ssub.add_parser(
        "create",
        parents=[conn, as_json],
        help="create a service",
        description="Create a service. Everything after -- is each replica's command.",
        usage="gpupool service create NAME [options] -- COMMAND...",
        epilog="example: gpupool service create chat --team web --gpu-mem 16GiB "
        "--replicas 1..8 --slo-p99-ms 200 -- python -m gpupool.examples.chat_replica",
    )
    c.add_argument("name", help="lower-case letters, digits and dashes")
    c.add_argument("--team", help="the team it serves for (default: the token's)")
    c.add_argument("--model", help="the model it serves (shown)")
    c.add_argument("--gpu-model", help="only run replicas on this GPU model")
    c.add_argument(
        "--gpu-mem",
        help="GPU memory of one replica (e.g. 16GiB); replicas share a card "
        "only where sharing pays",
    )
    c.add_argument("--replicas", default="1..1", help="MIN..MAX replicas (default 1..1)")
    c.add_argument("--slo-p99-ms", type=float, default=200.0, help="p99 latency bound (ms)")
    c.add_argument(
        "--replica-rps",
        type=float,
        default=10.0,
        help="requests/s one replica serves within the SLO (default 10)",
    )
    c.add_argument("--port-env", default="PORT", help="env var with the replica's port")
    c.add_argument("--grace", type=float, help="seconds to stop after SIGTERM (default 10)")
    c.add_argument("--priority", help="low, normal, high (default) or an integer")
    c.add_argument("--env", action="extend", nargs="+", default=[], metavar="K=V")
    c.add_argument("--cwd", help="working directory of the replicas")
    c.set_defaults(client_handler=cmd_create, svc_argv=[])

    ls = ssub.add_parser("ls", parents=[conn, as_json], help="list services")
    ls.set_defaults(client_handler=cmd_ls)

    show = ssub.add_parser(
        "show", parents=[conn, as_json], help="a service: its replicas, rps, p99, events"
    )
    show.add_argument("name")
    show.set_defaults(client_handler=cmd_show)

    sc = ssub.add_parser("scale", parents=[conn, as_json], help="set MIN..MAX replicas")
    sc.add_argument("name")
    sc.add_argument("replicas", help="MIN..MAX, e.g. 2..6")
    sc.set_defaults(client_handler=cmd_scale)

    d = ssub.add_parser(
        "delete", parents=[conn, as_json], help="delete a service (its replicas stop)"
    )
    d.add_argument("name")
    d.set_defaults(client_handler=cmd_delete)


def cmd_create(client: Client, args: argparse.Namespace) -> int:
    if not args.svc_argv:
        raise SpecError(
            "give each replica's command after --, e.g. gpupool service create chat "
            "--team web -- python -m gpupool.examples.chat_replica"
        )
    low, high = parse_replicas(args.replicas)
    spec: dict[str, Any] = {
        "name": args.name,
        "command": list(args.svc_argv),
        "min_replicas": low,
        "max_replicas": high,
        "slo_p99_ms": args.slo_p99_ms,
        "replica_rps": args.replica_rps,
        "port_env": args.port_env,
    }
    for key, value in (
        ("team", args.team),
        ("model", args.model),
        ("gpu_model", args.gpu_model),
        ("cwd", args.cwd),
        ("grace_s", args.grace),
    ):
        if value is not None:
            spec[key] = value
    if args.gpu_mem is not None:
        spec["gpu_mem_mib"] = parse_mem_mib(args.gpu_mem)
    if args.priority is not None:
        spec["priority"] = parse_priority(args.priority)
    if args.env:
        spec["env"] = parse_env(args.env)
    out = client.create_service(spec)
    return emit(
        args,
        out,
        lambda: (
            f"service {out['name']} created for team {out['team']}: replicas "
            f"{out['min_replicas']}..{out['max_replicas']}, p99 SLO {out['slo_p99_ms']:g} ms"
        ),
    )


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    services = client.services()
    return emit(args, {"services": services}, lambda: service_table(services))


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    s = client.service(args.name)
    return emit(args, s, lambda: service_text(s))


def cmd_scale(client: Client, args: argparse.Namespace) -> int:
    low, high = parse_replicas(args.replicas)
    s = client.scale_service(args.name, low, high)
    return emit(args, s, lambda: f"service {s['name']}: replicas {low}..{high}")


def cmd_delete(client: Client, args: argparse.Namespace) -> int:
    s = client.delete_service(args.name)
    return emit(
        args,
        s,
        lambda: f"service {s['name']} deleted; its replicas stop with their grace period",
    )
