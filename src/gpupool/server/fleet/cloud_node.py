"""Start or stop one "cloud" node: a machine that joins the Ray cluster as a gpupool node.

This is the stand-in for a cloud's node launcher that the sites file names under
`cloud: {start, stop}`; a real deployment replaces it with its provider's API call (start
an instance whose boot runs `gpupool node join HEAD_ADDRESS --name ... --site ...`). Here
the "instance" is `gpupool node join` on this machine with fake GPUs, its node directory
under the state directory: the same agent, the same retries while Ray fails to start, the
same drain on stop. `start` returns at once: the service learns that the node joined from
the Ray node list.

    python -m gpupool.server.fleet.cloud_node start --address 127.0.0.1:6379 --node c1 \\
        --model H100-80GB --gpus 4 --site cloud --state-dir .gpupool
    python -m gpupool.server.fleet.cloud_node stop --node c1 --state-dir .gpupool
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _pid_file(state_dir: Path, node: str) -> Path:
    return state_dir / "cloud" / f"{node}.pid"


def start(args: argparse.Namespace) -> int:
    pid_file = _pid_file(args.state_dir, args.node)
    if pid_file.is_file():
        pid = int(pid_file.read_text(encoding="utf-8"))
        if _alive(pid):
            print(f"cloud node {args.node} already runs (pid {pid})")
            return 0
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "gpupool",
        "node",
        "join",
        args.address,
        "--name",
        args.node,
        "--fake-gpus",
        f"{args.gpus}x{args.model}",
        "--node-dir",
        str(args.state_dir.absolute() / "cloud" / args.node),
        "--num-cpus",
        str(args.num_cpus),
        "--drain-timeout",
        str(args.drain_timeout_s),
    ]
    if args.site:
        argv += ["--site", args.site]
    log = pid_file.with_suffix(".join.log")
    with log.open("ab") as out:
        # its own session: `stop` signals the whole group (the join and its Ray processes)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    pid_file.write_text(str(proc.pid), encoding="utf-8")
    print(f"cloud node {args.node}: started `gpupool node join` (pid {proc.pid}, log {log})")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(args: argparse.Namespace) -> int:
    pid_file = _pid_file(args.state_dir, args.node)
    if not pid_file.is_file():
        print(f"cloud node {args.node}: not started here (no {pid_file})")
        return 0
    pgid = int(pid_file.read_text(encoding="utf-8"))
    try:  # the join drains the node and stops its Ray; what is left then is killed
        os.kill(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink()
        print(f"cloud node {args.node}: already gone")
        return 0
    deadline = time.monotonic() + args.grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    pid_file.unlink()
    print(f"cloud node {args.node}: stopped (process group {pgid})")
    return 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpupool.server.fleet.cloud_node",
        description="Start or stop a node standing in for a cloud instance (gpupool node join "
        "with fake GPUs).",
    )
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("start", help="start the node (returns at once)")
    s.add_argument("--address", required=True, help="the Ray cluster's GCS address")
    s.add_argument("--node", required=True, help="gpupool node name, e.g. c1")
    s.add_argument("--model", required=True, help="GPU model, e.g. H100-80GB")
    s.add_argument("--gpus", type=int, required=True, help="GPUs it declares")
    s.add_argument("--site", default="", help="its site in the sites file")
    s.add_argument("--num-cpus", type=int, default=1)
    s.add_argument(
        "--drain-timeout-s", type=float, default=60.0, help="on stop, how long its jobs may take"
    )
    s.add_argument("--state-dir", type=Path, required=True)
    t = sub.add_parser("stop", help="stop the node started by `start`")
    t.add_argument("--node", required=True)
    t.add_argument("--state-dir", type=Path, required=True)
    t.add_argument(
        "--grace-s",
        type=float,
        default=90.0,
        help="how long the node may take to drain and leave before it is killed",
    )
    args = p.parse_args(argv)
    return start(args) if args.action == "start" else stop(args)


if __name__ == "__main__":
    sys.exit(main())
