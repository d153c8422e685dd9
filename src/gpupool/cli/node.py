"""`gpupool node join`: make this machine a node of a gpupool Ray cluster (see
gpupool.server.agent.join)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpupool.cli.verbs import HELP

JOIN_EPILOG = """\
The head is a plain `ray start --head`; the server joins it with
`gpupool serve --ray HEAD_ADDRESS`. This command runs in the foreground until stopped, like
slurmd: Ctrl-C or SIGTERM drains the node (its jobs checkpoint and move to other nodes,
within --drain-timeout), then it leaves. Its process group holds the node's Ray processes:
killing that group is the machine's death, and its jobs are requeued elsewhere.

examples:
  gpupool node join 10.0.0.1:6379
  gpupool node join 127.0.0.1:6379 --name n2 --node-ip 127.0.0.2 \\
      --node-dir /var/lib/gpupool/n2 --fake-gpus 4xA100-80GB --label rack=r7
"""


def add_node_parser(sub: Any) -> None:
    p = sub.add_parser("node", help=HELP["node"], description=HELP["node"])
    verbs = p.add_subparsers(dest="node_command", required=True)
    j = verbs.add_parser(
        "join",
        help="make this machine a node of the cluster at HEAD_ADDRESS",
        description="Make this machine a node of a gpupool Ray cluster: a Ray worker node "
        "declaring gpupool's resources for its GPUs (NVML, or --fake-gpus), with its agent.",
        epilog=JOIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    j.add_argument("head", metavar="HEAD_ADDRESS", help="the Ray head, host:port")
    j.add_argument("--name", help="the node's gpupool name (default: the host name)")
    j.add_argument(
        "--node-dir",
        type=Path,
        help="the agent's records and scratch, and Ray's files for this node "
        "(default: /var/lib/gpupool/node-NAME)",
    )
    j.add_argument(
        "--fake-gpus",
        metavar="SPEC",
        help="declare fake GPUs instead of reading NVML, e.g. 4xA100-80GB (to try gpupool)",
    )
    j.add_argument(
        "--fake-inlet",
        metavar="GPU=CELSIUS,...",
        help="with --fake-gpus: the inlet air of some of them, e.g. 0=45,1=45 (a hot aisle)",
    )
    j.add_argument("--node-ip", metavar="ADDRESS", help="this node's address in the cluster")
    j.add_argument("--site", default="", help="the cluster (site) this node belongs to")
    j.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label for the node, e.g. rack=r7 (repeat for several): where it sits in "
        "the network, for the server's `topology: levels:` (a key of letters, digits and -)",
    )
    j.add_argument("--num-cpus", type=int, help="CPUs Ray may use here (default: all)")
    j.add_argument(
        "--drain-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="on SIGTERM, wait at most this long for the jobs to move (default 300)",
    )


def run_node(args: argparse.Namespace) -> int:
    from gpupool.server.agent.join import JoinOptions, default_name, parse_labels, run_join

    name = args.name or default_name()
    node_dir = args.node_dir or Path("/var/lib/gpupool") / f"node-{name}"
    opts = JoinOptions(
        head=args.head,
        name=name,
        node_dir=node_dir,
        fake_gpus=args.fake_gpus,
        fake_inlet=args.fake_inlet,
        node_ip=args.node_ip,
        site=args.site,
        labels=parse_labels(args.label),
        num_cpus=args.num_cpus,
        drain_timeout_s=args.drain_timeout,
    )
    return run_join(opts)
