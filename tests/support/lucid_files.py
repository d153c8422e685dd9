"""A small Lucid-format folder of measured pairs (single_data.csv, colocate_info.csv) for
tests that train the co-location predictor through a configuration: eight models, every
pair measured, bandwidth-heavy pairs much slower than their SM sum says."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

SOLO_HEADER = "model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label"
PAIR_HEADER = (
    ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
    "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem"
)


def write_lucid(folder: Path, seed: int = 0) -> Path:
    """The folder, written: speed = 1 - 0.9 * own bw * partner bw / 100^2 (+ small noise)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    solo = []
    for m in range(8):
        for i in range(4):
            sm = float(rng.uniform(20, 60))
            bw = float(rng.uniform(60, 95) if m % 2 == 0 else rng.uniform(2, 20))
            solo.append((f"M{m}", 32 * (i + 1), sm, bw))
    lines = [SOLO_HEADER]
    lines += [f"{m},D,{bs},0,100.0,{sm:.2f},{bw:.2f},2000.0,0" for m, bs, sm, bw in solo]
    (folder / "single_data.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = [PAIR_HEADER]
    for k, (a, b) in enumerate(itertools.combinations_with_replacement(solo, 2)):

        def speed(
            own: tuple[str, int, float, float], other: tuple[str, int, float, float]
        ) -> float:
            return float(1.0 - 0.9 * own[3] * other[3] / 100.0**2 + rng.normal(0, 0.01))

        lines.append(
            f"{k},{a[0]},D,1,{a[1]},0,{speed(a, b):.4f},{b[0]},D,1,{b[1]},0,{speed(b, a):.4f},"
            f"{a[2] + b[2]:.1f},{a[3] + b[3]:.1f},4000.0"
        )
    (folder / "colocate_info.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


PROFILES_CSV = "name,sm_util_pct,mem_bw_util_pct,mem_mib\nlight,30,10,2000\nheavy,40,90,2000\n"
"""Two job names: next to each other, heavy jobs run far slower than their SM sum (80%)
says; light ones do not."""
