"""The checkpoint protocol with PyTorch: a tiny regression that resumes where it stopped.

    python -m gpupool.examples.torch_train --steps N [--step-s S] [--every K]

Fits y = 3x - 1 (plus fixed noise) with a small MLP and Adam, full batch, from fixed seeds.
It saves model, optimizer and step with torch.save every K steps and on SIGTERM (then exits
0), and reloads them with torch.load when GPUPOOL_RESUME=1. Uses the GPU gpupool gave it
(CUDA_VISIBLE_DEVICES) if there is one, else the CPU. The last line is
``loss=<value> steps=<N> resumed_from=<step> device=<cpu|cuda>``; on the CPU the loss is
bit-for-bit the same whether or not the run was preempted.

PyTorch is not a gpupool dependency: install it where the job runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

CHECKPOINT_NAME = "train.pt"


def checkpoint_dir() -> Path:
    """$GPUPOOL_CHECKPOINT_DIR under gpupool; ./checkpoint when run by hand."""
    return Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR") or "checkpoint")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpupool.examples.torch_train",
        description="Train a tiny regression model with checkpoint/resume (gpupool example).",
    )
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (N >= 0)")
    parser.add_argument("--step-s", type=float, default=0.0, help="extra sleep per step")
    parser.add_argument("--every", type=int, default=50, help="checkpoint every K steps")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.step_s < 0 or args.every < 1:
        parser.error("need --steps >= 0, --step-s >= 0 and --every >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    stop_requested = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # Only note it: the loop saves between optimizer steps, where the state is whole.
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_sigterm)
    args = _parse(argv)
    try:
        # Imported here so that gpupool itself never needs torch (and mypy never sees it).
        torch: Any = importlib.import_module("torch")
    except ImportError:
        print(
            "torch_train needs PyTorch, which is not installed for "
            f"{sys.executable}; install it (pip install torch) and run the job again",
            file=sys.stderr,
        )
        return 2

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data_gen = torch.Generator().manual_seed(0)
    x = torch.linspace(-2.0, 2.0, 256).unsqueeze(1)
    y = 3.0 * x - 1.0 + 0.1 * torch.randn(x.shape, generator=data_gen)
    x, y = x.to(device), y.to(device)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(
        device
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()

    directory = checkpoint_dir()
    path = directory / CHECKPOINT_NAME

    def save(step: int) -> None:
        # Temp file then rename: a SIGKILL mid-write leaves the previous checkpoint whole.
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{CHECKPOINT_NAME}.tmp"
        state: dict[str, Any] = {
            "steps": args.steps,
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)

    step = 0
    resumed_from = 0
    if os.environ.get("GPUPOOL_RESUME") == "1":
        if not path.exists():
            print("resume requested but no checkpoint yet: starting from step 0", flush=True)
        else:
            # map_location: the new attempt may run on other GPUs, or on none.
            saved = torch.load(path, map_location=device, weights_only=True)
            if int(saved["steps"]) != args.steps:
                print(
                    f"checkpoint {path} is for --steps {saved['steps']}, not {args.steps}; "
                    "resume with the same arguments or clear the checkpoint directory",
                    file=sys.stderr,
                )
                return 2
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            step = resumed_from = int(saved["step"])
            print(f"resumed from step={step} on {device}", flush=True)

    loss = loss_fn(model(x), y)
    while step < args.steps:
        if stop_requested:
            save(step)
            print(f"SIGTERM: checkpoint saved at step={step}; exiting 0", flush=True)
            return 0
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if args.step_s:
            time.sleep(args.step_s)
        if step % args.every == 0:
            save(step)
            print(f"step={step} loss={loss.item():.6f} (checkpointed)", flush=True)
    save(step)
    with torch.no_grad():
        final = loss_fn(model(x), y).item()
    print(f"loss={final:.8f} steps={args.steps} resumed_from={resumed_from} device={device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
