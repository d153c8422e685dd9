"""The all-reduce example on its own (no scheduler): members on loopback agree on an exact
result whatever the number of members, a vanished peer ends the others with status 3
instead of a hang, and a run stopped by SIGTERM resumes from rank 0's checkpoint."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpupool.examples.allreduce import PEER_LOST, expected_result
from service_proc import free_port

MODULE = [sys.executable, "-m", "gpupool.examples.allreduce"]


def gang(world: int, ckpt: Path, *args: str, resume: bool = False) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "GPUPOOL_CHECKPOINT_DIR": str(ckpt),
        }
        if resume:
            env["GPUPOOL_RESUME"] = "1"
        procs.append(
            subprocess.Popen(
                [*MODULE, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def wait_started(procs: list[subprocess.Popen[str]], limit_s: float = 30.0) -> list[str]:
    """What each member printed up to its "member rank=" line, which it prints once its
    SIGTERM handler is in place (a signal sent before that kills a member still importing
    on a loaded host). Bounded: a member that says nothing in `limit_s` fails the test."""
    deadline = time.monotonic() + limit_s
    seen = []
    for p in procs:
        assert p.stdout is not None
        lines = ""
        while not lines.splitlines()[-1:] or not lines.splitlines()[-1].startswith("member rank="):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, left))
            line = p.stdout.readline() if ready else ""
            if not line:
                raise AssertionError(f"a member did not start in {limit_s:g} s: {lines!r}")
            lines += line
        seen.append(lines)
    return seen


def result(out: str) -> dict[str, str]:
    last = [x for x in out.splitlines() if x.startswith("result=")][-1]
    return dict(kv.split("=") for kv in last.split())


def test_members_agree_on_the_exact_result_whatever_their_number(tmp_path: Path) -> None:
    for world in (1, 3):
        procs = gang(world, tmp_path / f"w{world}", "--steps", "40", "--dim", "16")
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * world, outs
        assert int(result(outs[0])["result"]) == expected_result(40, 16)
        assert all(f"member rank={r} world={world}" in outs[r] for r in range(world))


def test_a_vanished_peer_ends_the_gang_and_the_run_resumes_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    args = ("--steps", "400", "--step-s", "0.02", "--every", "5", "--timeout-s", "5")
    rank0, rank1 = gang(2, tmp_path, *args)
    time.sleep(1.5)
    rank1.kill()
    started = time.monotonic()
    out, _ = rank0.communicate(timeout=30)
    assert rank0.returncode == PEER_LOST and "a member vanished" in out
    assert time.monotonic() - started < 10  # no hang on the dead peer
    # stop the next gang with SIGTERM, then finish on one member
    procs = gang(2, tmp_path, *args, resume=True)
    firsts = wait_started(procs)
    time.sleep(0.5)  # a few steps, so that the stop comes mid-run
    for p in procs:
        p.send_signal(signal.SIGTERM)
    outs = [first + p.communicate(timeout=30)[0] for first, p in zip(firsts, procs, strict=True)]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "SIGTERM: checkpoint saved" in outs[0]
    (alone,) = gang(1, tmp_path, "--steps", "400", "--every", "5", resume=True)
    out, _ = alone.communicate(timeout=60)
    fields = result(out)
    assert int(fields["result"]) == expected_result(400) and int(fields["resumed_from"]) > 0
