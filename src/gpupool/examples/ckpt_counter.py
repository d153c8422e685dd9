"""A slow, deterministic sum that survives any number of preemptions.

    python -m gpupool.examples.ckpt_counter --steps N --step-s S [--every K]

Adds i*i for i < N, one step at a time with a sleep of S seconds per step. It saves its
state every K steps and when SIGTERM arrives (then exits 0), and picks it up again when
started with GPUPOOL_RESUME=1. The last line is ``result=<sum> steps=<N> resumed_from=<step>``
and the sum equals (N-1)N(2N-1)/6 however often the job was stopped. Standard library only,
so it doubles as a template for jobs of any kind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

CHECKPOINT_NAME = "counter.json"


@dataclass(frozen=True)
class CounterState:
    """Everything needed to carry on: the next step to run and the sum so far."""

    steps: int
    step: int
    total: int


def expected_result(steps: int) -> int:
    """Closed form of sum(i*i for i in range(steps)), to check the job against."""
    return (steps - 1) * steps * (2 * steps - 1) // 6 if steps > 0 else 0


def checkpoint_dir() -> Path:
    """$GPUPOOL_CHECKPOINT_DIR under gpupool; ./checkpoint when run by hand."""
    return Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR") or "checkpoint")


def save(directory: Path, state: CounterState) -> None:
    """Temp file, fsync, rename: a SIGKILL mid-write leaves the previous checkpoint whole."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"steps": state.steps, "step": state.step, "total": state.total}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


def load(directory: Path) -> CounterState | None:
    try:
        with open(directory / CHECKPOINT_NAME, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return None
    return CounterState(int(raw["steps"]), int(raw["step"]), int(raw["total"]))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpupool.examples.ckpt_counter",
        description="A slow deterministic sum that checkpoints and resumes (gpupool example).",
    )
    parser.add_argument("--steps", type=int, required=True, help="how many steps (N >= 0)")
    parser.add_argument("--step-s", type=float, required=True, help="seconds of work per step")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every K steps")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.step_s < 0 or args.every < 1:
        parser.error("need --steps >= 0, --step-s >= 0 and --every >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    stop_requested = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # Only note it: the loop saves at the next step boundary, where the state is whole.
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_sigterm)
    args = _parse(argv)
    directory = checkpoint_dir()
    state = CounterState(args.steps, 0, 0)
    resumed_from = 0
    if os.environ.get("GPUPOOL_RESUME") == "1":
        loaded = load(directory)
        if loaded is None:
            print("resume requested but no checkpoint yet: starting from step 0", flush=True)
        elif loaded.steps != args.steps:
            print(
                f"checkpoint in {directory} is for --steps {loaded.steps}, not {args.steps}; "
                "resume with the same arguments or clear the checkpoint directory",
                file=sys.stderr,
            )
            return 2
        else:
            state, resumed_from = loaded, loaded.step
            print(f"resumed from step={state.step} total={state.total}", flush=True)
    while state.step < args.steps:
        if stop_requested:
            save(directory, state)
            print(f"SIGTERM: checkpoint saved at step={state.step}; exiting 0", flush=True)
            return 0
        state = CounterState(state.steps, state.step + 1, state.total + state.step * state.step)
        time.sleep(args.step_s)
        if state.step % args.every == 0:
            save(directory, state)
            print(f"step={state.step} total={state.total} (checkpointed)", flush=True)
    save(directory, state)
    print(f"result={state.total} steps={args.steps} resumed_from={resumed_from}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
