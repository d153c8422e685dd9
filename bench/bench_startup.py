"""Speed targets for what a user waits on at the prompt, each a whole process, median of 5:
`gpupool --version` <= 150 ms and the 876-job Philly FIFO replay <= 0.3 s wall.

Bytecode is compiled first (as `pip install` does) and each command runs once before it
is timed, so the figures are a warm start of an installed gpupool, not of a first import.
With --baseline REV the same commands also run from a checkout of REV (same interpreter and
libraries, its own source on PYTHONPATH), alternating with this tree run by run, so before
and after are measured in one run under the same load.

Writes bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from baseline import baseline_source
from machine import describe

ROOT = Path(__file__).resolve().parent.parent
TARGETS_S = {"version": 0.150, "philly_fifo_replay": 0.300}
RUNS = 5


def philly_list() -> Path:
    for base in (ROOT.parent / "shared", ROOT / "shared"):
        path = base / "traces" / "philly" / "elasticflow_philly_103959.csv"
        if path.is_file():
            return path
    raise SystemExit("shared/traces/philly/elasticflow_philly_103959.csv not found")


def commands() -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "gpupool"]
    trace = ["--trace", str(philly_list()), "--format", "elasticflow", "--queue", "fifo"]
    return {
        "version": [*cli, "--version"],
        "philly_fifo_replay": [*cli, "simulate", "replay", *trace],
    }


def environment(src: Path) -> dict[str, str]:
    """This interpreter with `src`'s gpupool, its bytecode compiled (as `pip install` does)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(src / "gpupool")],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return env


def wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(sides: dict[str, Path]) -> dict[str, dict[str, dict[str, object]]]:
    """Each command on each side RUNS times; the sides alternate run by run (the first to go
    alternates too), so a busy machine slows both alike."""
    envs = {side: environment(src) for side, src in sides.items()}
    out: dict[str, dict[str, dict[str, object]]] = {side: {} for side in sides}
    for name, argv in commands().items():
        walls: dict[str, list[float]] = {side: [] for side in sides}
        for env in envs.values():
            wall(argv, env)  # warm the caches
        order = list(sides)
        for _ in range(RUNS):
            for side in order:
                walls[side].append(wall(argv, envs[side]))
            order.reverse()
        for side, times in walls.items():
            out[side][name] = {
                "median_s": round(statistics.median(times), 3),
                "runs_s": [round(w, 3) for w in times],
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--baseline", metavar="REV", help="also time the commands from this git revision"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = ap.parse_args()
    result: dict[str, object] = {"targets_s": TARGETS_S, "runs": RUNS, "machine": describe()}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"now": ROOT / "src"}
        if args.baseline:
            baseline_source(args.baseline, Path(tmp) / "baseline")
            sides["baseline"] = Path(tmp) / "baseline" / "src"
        measured = measure(sides)
    now = measured["now"]
    result["now"] = now
    if args.baseline:
        result["baseline"] = {"rev": args.baseline, **measured["baseline"]}
    ok = all(float(str(now[k]["median_s"])) <= t for k, t in TARGETS_S.items())
    result["meets_targets"] = ok
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, target in TARGETS_S.items():
        base = result.get("baseline")
        before = f" (baseline {base[name]['median_s']:.3f} s)" if isinstance(base, dict) else ""
        print(f"{name}: median {now[name]['median_s']:.3f} s, target {target:.3f} s{before}")
    print(f"{'OK' if ok else 'MISSED'}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
