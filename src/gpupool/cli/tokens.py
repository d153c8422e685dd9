"""`gpupool token create|ls|revoke` and `gpupool audit`: credentials and the audit trail
(admin tokens), from a terminal.

Parsing is cli/parse.py's, the tables cli/render.py's, and --json goes through
cli/output.py's emit().
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from gpupool.cli.output import emit
from gpupool.cli.parse import parse_duration
from gpupool.cli.render import audit_table, printable, token_created_text, token_table
from gpupool.cli.verbs import HELP
from gpupool.errors import SpecError

if TYPE_CHECKING:
    from gpupool.client import Client


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


def cmd_token_create(client: Client, args: argparse.Namespace) -> int:
    role = "admin" if args.admin else "read-only" if args.read_only else "team"
    expires = None if args.expires is None else parse_duration(args.expires, "--expires")
    made = client.create_token(args.name, args.team, role, expires)
    return emit(args, made, lambda: token_created_text(made))


def cmd_token_ls(client: Client, args: argparse.Namespace) -> int:
    tokens = client.tokens()
    return emit(args, {"tokens": tokens}, lambda: token_table(tokens))


def cmd_token_revoke(client: Client, args: argparse.Namespace) -> int:
    gone = client.revoke_token(args.ref)
    return emit(
        args,
        gone,
        lambda: f"token {printable(str(gone.get('name')))} (id {gone.get('id')}) revoked",
    )


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise SpecError(f"--limit {args.limit}: ask for at least 1 row")
    since = None if args.since is None else time.time() - parse_duration(args.since, "--since")
    rows = client.audit(limit=args.limit, since=since, token=args.audit_token)
    return emit(args, {"audit": rows}, lambda: audit_table(rows))
