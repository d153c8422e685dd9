"""gpupool's commands: which module builds and runs each, and its one-line help.

Kept free of imports so that `gpupool --version`, `gpupool --help` and the top-level
parser never load a command's dependencies (NumPy, SQLAlchemy, Ray); a command's module
is imported only when that command runs (see cli/main.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandGroup:
    """Commands built and run by one module: `add(subparsers)` adds their parsers and
    `run(args) -> int` runs the parsed command."""

    module: str
    add: str
    run: str
    helps: tuple[tuple[str, str], ...]


GROUPS: tuple[CommandGroup, ...] = (
    CommandGroup(
        "gpupool.cli.simulate",
        "add_simulate_parsers",
        "run_simulate",
        (
            ("simulate", "run a trace-driven experiment"),
            ("policies", "list placement and queue policies"),
        ),
    ),
    CommandGroup(
        "gpupool.cli.plan",
        "add_plan_parser",
        "run_plan",
        (("plan", "size a model-shaped job: GPU type x count, memory, speed and cost"),),
    ),
    CommandGroup(
        "gpupool.cli.report",
        "add_report_parser",
        "run_report",
        (
            (
                "report",
                "the monthly review: utilisation, use vs allocation, recommendations, cost (HTML)",
            ),
        ),
    ),
    CommandGroup(
        "gpupool.cli.loadgen",
        "add_loadgen_parser",
        "run_loadgen",
        (("loadgen", "send trace-shaped HTTP load to a service's replicas on loopback"),),
    ),
    CommandGroup(
        "gpupool.cli.remote",
        "add_client_parsers",
        "run_client",
        (
            ("submit", "submit a job to the server"),
            ("ls", "list the server's jobs"),
            ("show", "show one job"),
            ("why", "why a job waits: its reason code and the sentence with the numbers"),
            ("cancel", "cancel a job"),
            ("logs", "print a job's output"),
            ("top", "live view of GPUs, jobs and the scale-out signals"),
            ("token", "create, list and revoke API tokens (admin)"),
            ("audit", "who did what, when, from where (admin)"),
            ("learn", "the learned scheduling policy: status, promote, demote (admin)"),
            ("hold", "keep a waiting job from starting until released"),
            ("release", "let a held job start again"),
            (
                "requeue",
                "stop a running job (SIGTERM and its grace to checkpoint) and queue it again",
            ),
            ("drain", "no new jobs on a node; its running jobs finish (admin)"),
            ("nodes", "the nodes and their state"),
            ("service", "online services whose replicas scale with their traffic"),
        ),
    ),
    CommandGroup(
        "gpupool.cli.node",
        "add_node_parser",
        "run_node",
        (("node", "this machine as a node of a Ray cluster: gpupool node join HEAD_ADDRESS"),),
    ),
    CommandGroup(
        "gpupool.cli.serve",
        "add_serve_parser",
        "run_serve",
        (("serve", "run the scheduler service (API, database, local executor, GPU telemetry)"),),
    ),
)

HELP: dict[str, str] = {name: text for g in GROUPS for name, text in g.helps}
"""Command name -> its line in `gpupool --help`."""

GROUP_OF: dict[str, CommandGroup] = {name: g for g in GROUPS for name, _ in g.helps}
