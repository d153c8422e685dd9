"""Check NvmlTelemetry against a real GPU: run this on a lent GPU machine, not in CI.

    python bench/device_check.py [--samples 10] [--interval-s 1] [--reps 200]

Prints JSON lines: the host, every GPU's inventory, `--samples` samples `--interval-s`
apart, the mean cost of sample() per GPU (the H200 calibration read 8 fields in
0.024 ms per GPU, shared/calibration/README.md; sample() makes about 10 NVML calls), and
the result of setting each GPU's power limit to the limit it already has.

That last step changes nothing on the card: it sets the management limit it reads back,
and leaves the clocks alone (apply() would also reset any SM clock lock, which the lent
machine's owners may have set). Pass --full-apply to run apply() itself, clock reset
included. Without a GPU it prints the NoGpuError message and exits 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from gpupool.energy.powercap import SetPowerCap
from gpupool.server.telemetry.nvml import NoGpuError, NvmlTelemetry

CALIBRATION_MS_PER_GPU = 0.024


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def host_facts() -> dict[str, Any]:
    """Driver and NVML versions, read while NvmlTelemetry holds NVML open."""
    import pynvml  # type: ignore[import-untyped]

    facts: dict[str, Any] = {}
    for key, fn in (
        ("driver", pynvml.nvmlSystemGetDriverVersion),
        ("nvml", pynvml.nvmlSystemGetNVMLVersion),
    ):
        try:
            value = fn()
            facts[key] = value.decode() if isinstance(value, bytes) else str(value)
        except pynvml.NVMLError as exc:
            facts[key] = f"unavailable ({exc})"
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=200, help="sample() calls to time")
    parser.add_argument("--full-apply", action="store_true", help="apply(), clock reset too")
    args = parser.parse_args(argv)

    try:
        tel = NvmlTelemetry()
    except NoGpuError as exc:
        print(exc, flush=True)
        return 3
    try:
        emit("host", **host_facts())
        inventory = tel.inventory()
        for info in inventory:
            emit("inventory", **asdict(info))

        for i in range(args.samples):
            if i:
                time.sleep(args.interval_s)
            for s in tel.sample(time.time()):
                emit("sample", **asdict(s), mem_free_mib=s.mem_free_mib)

        reps = max(1, args.reps)
        start = time.perf_counter()
        for _ in range(reps):
            tel.sample(0.0)
        elapsed_s = time.perf_counter() - start
        emit(
            "timing",
            reps=reps,
            gpus=len(inventory),
            mean_ms_per_gpu=elapsed_s / reps / len(inventory) * 1000.0,
            calibration_ms_per_gpu=CALIBRATION_MS_PER_GPU,
        )

        for info in inventory:
            limit_w = tel.current_limit_w(info.index)
            if limit_w is None:
                emit("apply", gpu=info.index, ok=False, message="current limit unreadable")
                continue
            if args.full_apply:
                cmd = SetPowerCap(0, info.index, limit_w, None, "device check: same limit")
                result = tel.apply(cmd)
                mode = "apply"
            else:
                result = tel.set_power_limit(info.index, limit_w)
                mode = "limit-only"
            emit(
                "apply",
                gpu=info.index,
                mode=mode,
                limit_w=limit_w,
                ok=result.ok,
                message=result.message,
                limit_after_w=tel.current_limit_w(info.index),
            )
    finally:
        tel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
