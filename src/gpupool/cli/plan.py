"""`gpupool plan`: which GPU type and how many for a model, ranked by cost per unit of work."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from gpupool.cli.parse import parse_count, parse_counts
from gpupool.cli.table import render
from gpupool.cli.verbs import HELP
from gpupool.errors import GpupoolError, SpecError
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.memory import BYTES_PER_ELEM, OPTIMIZERS, RECOMPUTE
from gpupool.sizing.planner import TASKS, PlanOption, PlanRequest, plan
from gpupool.sizing.shapes import ModelShape, get_shape, parse_shape, shape_names

EXAMPLES = """\
examples:
  gpupool plan --model llama-3-70b --task inference --precision bf16 --context 8192 --batch 16
  gpupool plan --model llama-3-8b --tokens 50M --deadline 2h --gpus L4,A10,L40S,H100
  gpupool plan --model llama-3-8b --task training --seq-len 4096 --batch 2 --grad-accum 4 \\
      --tokens 1B --deadline 12h
  gpupool plan --shape "params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8" --counts 4,8
  gpupool plan --model mixtral-8x7b --catalog our-prices.csv --json plan.json

Inference: --batch concurrent sequences, each with --context tokens of KV cache; speed is
decode throughput. Training: --batch is the micro-batch per data-parallel rank of --seq-len
tokens; memory follows ZeRO --zero-stage and --recompute. Costs come from the catalogue's
typical on-demand price per GPU-hour; override prices with --catalog (a CSV with a 'gpu'
column and the columns to change, e.g. price_usd_per_hour). Formulas: docs/sizing.md.
"""

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `plan` command to the top-level subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help=HELP["plan"],
        description="Rank every GPU type x count for a model: memory per GPU, whether it "
        "fits, estimated tokens/s (inference) or step time (training), and cost. Options "
        "that fit and meet the deadline come first, cheapest per unit of work first.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help=f"a known model: {', '.join(shape_names())}")
    model.add_argument(
        "--shape",
        help="any model as key=value pairs: params_b, active_params_b, layers, hidden, heads, "
        "kv_heads, head_dim, vocab, ffn_hidden, name (layers, hidden, heads required)",
    )
    p.add_argument("--task", default="inference", choices=TASKS)
    p.add_argument(
        "--precision",
        default="bf16",
        choices=tuple(BYTES_PER_ELEM),
        help="weights (and training math) precision (default bf16)",
    )
    p.add_argument(
        "--kv-precision",
        choices=tuple(BYTES_PER_ELEM),
        help="KV cache precision (default: weights')",
    )
    p.add_argument(
        "--context", type=int, help="inference: tokens per sequence held in KV cache (4096)"
    )
    p.add_argument(
        "--seq-len", type=int, help="training: tokens per sequence (default --context or 4096)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="inference: concurrent sequences; training: micro-batch per data-parallel rank",
    )
    p.add_argument("--grad-accum", type=int, default=1, help="training: micro-batches per step")
    p.add_argument("--zero-stage", type=int, default=3, choices=(0, 1, 2, 3), help="training")
    p.add_argument("--recompute", default="selective", choices=RECOMPUTE, help="training")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS, help="training")
    p.add_argument(
        "--tokens", help="work: tokens to generate or train on, e.g. 5e8, 500M, 2B (adds $/job)"
    )
    p.add_argument("--deadline", help="finish within: 2h, 30m, 3600s, 1h30m or plain seconds")
    p.add_argument("--gpus", help="comma-separated GPU types to try (default: whole catalogue)")
    p.add_argument("--counts", default="1,2,4,8", help="GPU counts to try (default 1,2,4,8)")
    p.add_argument("--catalog", type=Path, help="operator catalogue CSV laid over the packaged one")
    p.add_argument("--top", type=int, help="print only the best N rows")
    p.add_argument(
        "--all", action="store_true", help="also list options that do not fit (default: summary)"
    )
    p.add_argument("--json", type=Path, help="write the request and ranked options here")
    return p


def parse_duration(text: str) -> float:
    """'2h', '30m', '3600s', '1h30m', '1.5d' or plain seconds -> seconds."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", raw)
        if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhd])", "", raw).strip():
            raise SpecError(
                f"--deadline {text!r}: use a number with s, m, h or d (2h, 30m, 1h30m) "
                "or plain seconds"
            ) from None
        value = sum(float(n) * _UNITS_S[u] for n, u in parts)
    if not value > 0:
        raise SpecError(f"--deadline {text!r} must be more than zero")
    return value


def build_request(args: argparse.Namespace) -> PlanRequest:
    shape: ModelShape = get_shape(args.model) if args.model else parse_shape(args.shape)
    context = args.context if args.context is not None else 4096
    seq_len = args.seq_len if args.seq_len is not None else context
    gpus = tuple(g.strip() for g in args.gpus.split(",") if g.strip()) if args.gpus else None
    if args.gpus is not None and not gpus:
        raise SpecError("--gpus is empty; give GPU names such as H100,L40S")
    return PlanRequest(
        shape=shape,
        task=args.task,
        precision=args.precision,
        context=context,
        seq_len=seq_len,
        batch=args.batch,
        tokens=parse_count(args.tokens) if args.tokens else None,
        deadline_s=parse_duration(args.deadline) if args.deadline else None,
        counts=tuple(parse_counts(args.counts)),
        gpus=gpus,
        zero_stage=args.zero_stage,
        recompute=args.recompute,
        optimizer=args.optimizer,
        grad_accum=args.grad_accum,
        kv_precision=args.kv_precision,
    )


def run_plan(args: argparse.Namespace) -> int:
    """Print the ranked table (and write JSON); errors go to stderr with exit code 2."""
    try:
        if args.top is not None and args.top < 1:
            raise SpecError("--top must be at least 1")
        request = build_request(args)
        catalog = load_catalog(args.catalog)
        if request.gpus is not None:
            for name in request.gpus:
                catalog.resolve(name)
        options = plan(request, catalog)
        print(format_table(request, options, top=args.top, show_all=args.all))
        if args.json:
            _write_json(args.json, request, options)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc}", file=sys.stderr)
        return 2
    return 0


def format_table(
    request: PlanRequest, options: list[PlanOption], top: int | None = None, show_all: bool = False
) -> str:
    """The ranked options as an aligned table, with a title and a footer."""
    shown = options if show_all else [o for o in options if o.fits]
    if top is not None:
        shown = shown[:top]
    training = request.task == "training"
    per_job = request.tokens is not None
    headers = ["rank GPU x count", "parallel", "GiB/GPU", "GPU GiB", "fits"]
    headers += ["step s", "tokens/s"] if training else ["tokens/s"]
    headers += ["$/hour", "$/M tokens"]
    if per_job:
        headers += ["run h", "$/job"]
    if request.deadline_s is not None:
        headers += ["deadline"]
    rows: list[list[object]] = []
    for k, o in enumerate(shown, 1):
        row: list[object] = [
            f"{k:>2}. {o.gpu} x{o.count}",
            o.parallel,
            f"{o.mem_per_gpu_gib:,.1f}",
            f"{o.gpu_memory_gib:,.1f}",
            "yes" if o.fits else "no",
        ]
        if training:
            row.append(_num(o.est_step_s, 2))
        row.append(_num(o.throughput_tokens_per_s, 0))
        row += [o.cost_per_hour_usd, _num(o.cost_per_million_tokens_usd, 3)]
        if per_job:
            row += [_num(None if o.run_s is None else o.run_s / 3600, 2), o.cost_per_job_usd]
        if request.deadline_s is not None:
            row.append({True: "met", False: "missed", None: "-"}[o.meets_deadline])
        rows.append([("-" if c is None else c) for c in row])
    what = (
        f"seq {request.seq_len} x micro-batch {request.batch} x accum {request.grad_accum}, "
        f"ZeRO-{request.zero_stage}, recompute {request.recompute}, {request.optimizer}"
        if training
        else f"context {request.context}, batch {request.batch}"
    )
    title = f"gpupool plan: {request.shape.name} {request.task} {request.precision}, {what}"
    if per_job:
        title += f"; {request.tokens:,.0f} tokens"
    if request.deadline_s is not None:
        title += f"; deadline {request.deadline_s / 3600:,.2f} h"
    out = [render(headers, rows, title=title)] if rows else [title, "(no option fits)"]
    out.append(_footer(options, show_all))
    return "\n".join(out)


def _footer(options: list[PlanOption], show_all: bool) -> str:
    fewest: dict[str, int] = {}
    largest: dict[str, PlanOption] = {}
    for o in options:
        if o.fits:
            fewest[o.gpu] = min(o.count, fewest.get(o.gpu, o.count))
        elif o.gpu not in largest or o.count > largest[o.gpu].count:
            largest[o.gpu] = o
    lines = []
    if fewest:
        lines.append("fewest GPUs that fit: " + ", ".join(f"{g} x{n}" for g, n in fewest.items()))
    never = [o for g, o in largest.items() if g not in fewest]
    if never and not show_all:
        lines.append(
            "never fits in the counts tried: "
            + "; ".join(f"{o.gpu} (x{o.count}: {o.note})" for o in never)
        )
    lines.append("Estimates (roofline + interconnect model), not measurements: docs/sizing.md.")
    return "\n" + "\n".join(lines)


def _num(value: float | None, digits: int) -> str | None:
    if value is None:
        return None
    return f"{value:,.{digits}f}"


def _write_json(path: Path, request: PlanRequest, options: list[PlanOption]) -> None:
    payload = {"request": request.as_dict(), "options": [o.as_dict() for o in options]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror}; choose a writable path") from None
    print(f"wrote {path}", file=sys.stderr)
