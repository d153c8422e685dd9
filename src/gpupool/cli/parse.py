"""Parse what a command was given: durations, memory, counts, priorities, GPU requests,
environment pairs, replica ranges and a job's sizing, each refused with a message that says
how to write it.

Shared by the commands so that `gpupool submit`, `gpupool service create` and `gpupool plan`
read the same text the same way; argparse builds the flags, these read their values.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from gpupool.errors import SpecError

PRIORITIES = ("low", "normal", "high")

_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))
_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
    r"(?:(\d+(?:\.\d+)?)s)?"
)


_MEM = re.compile(r"(\d+(?:\.\d+)?)\s*(tib|t|gib|g|mib|m)")
_MEM_MIB = {"t": 1024 * 1024, "tib": 1024 * 1024, "g": 1024, "gib": 1024, "m": 1, "mib": 1}


def parse_mem_mib(text: str, what: str = "--gpu-mem") -> int:
    """'20GiB', '20G', '512MiB', '1.5TiB' -> MiB (binary units; rounded up)."""
    match = _MEM.fullmatch(text.strip().lower())
    if match is None:
        raise SpecError(f"{what} {text!r}: give an amount with a binary unit, e.g. 20GiB or 512MiB")
    mib = math.ceil(float(match.group(1)) * _MEM_MIB[match.group(2)])
    if mib <= 0:
        raise SpecError(f"{what} {text!r} must be more than zero")
    return mib


def gpu_request(gpus: str | None, gpu_mem: str | None) -> dict[str, Any]:
    """--gpus N (whole GPUs), --gpus 2..4 (elastic: 2 to 4 whole GPUs), --gpus 0.25 (part
    of one) or --gpu-mem 20GiB (part of one, by memory) as the API's fields."""
    out: dict[str, Any] = {}
    if gpus is not None and ".." in gpus:
        low, _, high = gpus.partition("..")
        if not (low.strip().isdigit() and high.strip().isdigit()):
            raise SpecError(f"--gpus {gpus!r}: an elastic range is two whole numbers, e.g. 2..4")
        lo, hi = int(low), int(high)
        if not 1 <= lo <= hi:
            raise SpecError(f"--gpus {gpus}: an elastic range needs 1 <= MIN <= MAX, e.g. 2..4")
        if gpu_mem is not None:
            raise SpecError("an elastic job (--gpus MIN..MAX) takes whole GPUs; drop --gpu-mem")
        out["gpus"] = hi
        if lo < hi:
            out["gpus_min"] = lo
        return out
    if gpus is not None:
        try:
            value = float(gpus)
        except ValueError:
            raise SpecError(
                f"--gpus {gpus!r}: give a whole number, or a fraction like 0.25"
            ) from None
        if value != value or value in (math.inf, -math.inf):
            raise SpecError(f"--gpus {gpus!r}: give a whole number, or a fraction like 0.25")
        if value == int(value):  # the server checks the count
            out["gpus"] = int(value)
        elif 0 < value < 1:
            out["gpus"], out["gpu_share"] = 1, value
        else:
            raise SpecError(
                f"--gpus {gpus}: only part of one GPU can be shared; ask for whole GPUs "
                "or for a fraction below 1"
            )
    if gpu_mem is not None:
        if "gpu_share" in out:
            raise SpecError("give --gpus 0.25 or --gpu-mem, not both")
        if out.get("gpus", 1) != 1:
            raise SpecError("--gpu-mem asks for part of one GPU; drop --gpus or give --gpus 1")
        out["gpus"], out["gpu_mem_mib"] = 1, parse_mem_mib(gpu_mem)
    return out


def parse_duration(text: str, what: str = "duration", allow_zero: bool = False) -> float:
    """'45s', '30m', '2h', '1h30m', '1d' or plain seconds -> seconds.

    Units go largest first, each at most once, so a typo like '30m1h' is caught rather than
    guessed at.
    """
    raw = text.strip().lower()
    value: float | None = None
    try:
        value = float(raw)
    except ValueError:
        match = _DURATION.fullmatch(raw)
        if raw and match:
            value = sum(float(n) * f for n, (_, f) in zip(match.groups(), _UNITS, strict=True) if n)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        raise SpecError(
            f"{what} {text!r}: use a number with d, h, m or s (45s, 30m, 2h, 1h30m) or seconds"
        )
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"{what} {text!r} must be {'zero or ' if allow_zero else ''}more than zero")
    return value


def parse_number(text: str, what: str, allow_zero: bool = False) -> float:
    """A finite number more than zero (or zero too, with allow_zero)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SpecError(f"{what} {text!r}: give a number, e.g. {what} 12.5")
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"{what} {text!r} must be {'zero or ' if allow_zero else ''}more than zero")
    return value


def parse_deadline(text: str, now: float) -> float:
    """--deadline -> deadline_at: a plain number is an absolute Unix time in seconds, which
    must lie ahead; a duration with units (90s, 30m, 2h, 1h30m, 1d) counts from `now`."""
    raw = text.strip().lower()
    try:
        at = float(raw)
    except ValueError:
        return now + parse_duration(text, "--deadline")
    if not math.isfinite(at):
        raise SpecError(f"--deadline {text!r}: give a Unix time in seconds or a duration like 2h")
    if at <= now:
        raise SpecError(
            f"--deadline {text!r} is a Unix time that has passed; for a time from now give "
            f"units, e.g. --deadline {_plain(at)}s"
        )
    return at


def _plain(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def parse_priority(text: str) -> int | str:
    """'low', 'normal', 'high' go to the server as names; anything else must be an integer."""
    if text.lower() in PRIORITIES:
        return text.lower()
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"--priority {text!r}: use low, normal, high or an integer") from None


def parse_env(pairs: list[str]) -> dict[str, str]:
    """--env KEY=VALUE ... -> {KEY: VALUE}; a pair without = is refused."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise SpecError(
                f"--env {pair!r}: use KEY=VALUE; put the job's command after --, "
                "e.g. gpupool submit --env A=1 -- python train.py"
            )
        env[key] = value
    return env


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str, what: str = "--tokens") -> float:
    """'5e8', '500M', '2B', '10k' -> a number."""
    raw = text.strip().lower().replace("_", "").replace(",", "")
    match = re.fullmatch(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbgt]?)", raw)
    if not match:
        raise SpecError(f"{what} {text!r}: use a number such as 5e8, 500M or 2B")
    value = float(match.group(1)) * _SUFFIX[match.group(2)]
    if not value > 0:
        raise SpecError(f"{what} must be more than zero")
    return value


def parse_counts(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]."""
    try:
        counts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise SpecError(f"--counts {text!r}: use whole numbers, e.g. 1,2,4,8") from None
    if not counts or min(counts) < 1:
        raise SpecError(f"--counts {text!r}: counts must be 1 or more")
    return counts


_RANGE = re.compile(r"(\d+)(?:\.\.(\d+))?")


def parse_replicas(text: str) -> tuple[int, int]:
    """'1..8' -> (1, 8); '3' -> (3, 3)."""
    match = _RANGE.fullmatch(text.strip())
    if match is None:
        raise SpecError(f"replicas {text!r}: give MIN..MAX (e.g. 1..8) or one number")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low > high or high < 1:
        raise SpecError(f"replicas {text}: give MIN..MAX with MIN <= MAX and MAX >= 1")
    return low, high


def page_limit(args: argparse.Namespace) -> int | None:
    """--limit N or --all (cli/flags.py's add_paging_flags) -> how many jobs; None: all."""
    if args.all:
        return None
    if args.limit < 1:
        raise SpecError(f"--limit {args.limit}: show at least 1 job, or --all")
    return int(args.limit)


def time_limit(args: argparse.Namespace) -> dict[str, Any]:
    """The submit fields --time gives."""
    if getattr(args, "time", None) is None:
        return {}
    return {"time_limit_s": parse_duration(args.time, "--time")}


SIZING_FLAGS = (
    "task",
    "precision",
    "kv_precision",
    "context",
    "seq_len",
    "batch",
    "grad_accum",
    "zero_stage",
    "recompute",
    "optimizer",
    "tokens",
    "counts",
)
"""The submit flags (dests) that go into the job's sizing, besides --model / --shape."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def parse_sizing(args: argparse.Namespace) -> dict[str, Any] | None:
    """The job's sizing from --model / --shape and the planner's flags (None without a
    model), checked as the server will check it, so a mistake is refused before sending."""
    given = {k: getattr(args, k) for k in SIZING_FLAGS if getattr(args, k) is not None}
    if args.model is None and args.shape is None:
        if given:
            raise SpecError(
                f"{_flag(next(iter(given)))} sizes a job by its model: give --model (or "
                "--shape) too, e.g. gpupool submit --model llama-3-8b --batch 8 -- python serve.py"
            )
        return None
    from gpupool.sizing.request_json import SHAPE_FIELDS, SizingError, plan_request_from
    from gpupool.sizing.shapes import get_shape, parse_shape

    sizing: dict[str, Any] = {}
    if args.model is not None:
        sizing["model"] = get_shape(args.model).name  # the name as the server knows it
    else:
        shape = parse_shape(args.shape)
        sizing["shape"] = {k: getattr(shape, k) for k in SHAPE_FIELDS}
    sizing.update(given)
    if args.tokens is not None:
        sizing["tokens"] = parse_count(args.tokens, "--tokens")
    if args.counts is not None:
        sizing["counts"] = parse_counts(args.counts)
    try:
        plan_request_from(sizing)
    except SizingError as err:
        where = err.loc[0] if err.loc else "model"
        flag = "--shape" if where == "shape" else _flag(where)
        raise SpecError(f"{flag}: {err.reason}") from None
    return sizing
