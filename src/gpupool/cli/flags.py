"""The flags every command that talks to a server shares: where the server is and who asks
(--url, --token, --ca-cert), --json, and paging (--limit or --all).

Built once and handed to each command's parser as argparse parents, so the flags read the
same in every command; page_limit() in cli/parse.py reads the paging pair.
"""

from __future__ import annotations

import argparse


def connection_flags() -> argparse.ArgumentParser:
    """--url, --token and --ca-cert, as a parent parser."""
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
    return conn


def json_flag() -> argparse.ArgumentParser:
    """--json, as a parent parser (cli/output.py's emit() reads it)."""
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the server's JSON")
    return as_json


def add_paging_flags(p: argparse.ArgumentParser, default: int) -> None:
    """--limit N (the newest N jobs, `default` unless given) or --all."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--limit",
        type=int,
        default=default,
        metavar="N",
        help=f"show the newest N jobs ({default})",
    )
    g.add_argument("--all", action="store_true", help="show every job, page by page")
