"""The commands that talk to a gpupool server: their parsers, in the order `gpupool --help`
lists them, and the one place that opens the client and runs the parsed one.

cli/verbs.py names this module for all of them, so `gpupool ls` loads them together (and
httpx only when one runs); each command lives in its own module: jobs, nodes, tokens,
learn, services. To add one, write its parser and `cmd_*(client, args) -> int` there, set
`client_handler` on the parser, add it below, and add its name and help line to verbs.py.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpupool.cli import jobs, learn, nodes, services, tokens
from gpupool.cli.flags import connection_flags, json_flag

if TYPE_CHECKING:
    import httpx

    from gpupool.client import Client

# Tests swap these: a fake server transport, and no real waiting (the client carries this
# sleep to its retries, to `logs -f` and to `top`).
TRANSPORT: httpx.BaseTransport | None = None
sleep: Callable[[float], None] = time.sleep


def add_client_parsers(sub: Any) -> None:
    """Add the commands that talk to a gpupool server to the top-level subparsers."""
    conn, as_json = connection_flags(), json_flag()
    jobs.add_job_parsers(sub, conn, as_json)
    nodes.add_top_parser(sub, conn)
    tokens.add_credential_parsers(sub, conn, as_json)
    learn.add_learn_parser(sub, conn, as_json)
    jobs.add_hold_parsers(sub, conn, as_json)
    nodes.add_node_parsers(sub, conn, as_json)
    services.add_service_parsers(sub, conn, as_json)


def run_client(args: argparse.Namespace) -> int | None:
    """Run a client command; None when `args` is some other command."""
    offline: Callable[[argparse.Namespace], int] | None = getattr(args, "offline_handler", None)
    if offline is not None:  # a subcommand of a client verb that needs no server
        return offline(args)
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
