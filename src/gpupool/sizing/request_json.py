"""A live job's `sizing` field: the planner's PlanRequest as a JSON mapping, and back.

A job may be given by its model instead of (or besides) a GPU count; the jobs table keeps
that request in its nullable JSON column `sizing`, and the scheduler core sizes the job per
GPU type from it (gpupool.sizing.planner.sized_options), as the simulator does for the
`model-jobs` generator.

The mapping holds PlanRequest's fields by their names: `model` (a packaged model name,
gpupool.sizing.shapes) or `shape` (a ModelShape's fields: layers, hidden and heads at
least), and task, precision, kv_precision, context, seq_len, batch, grad_accum, tokens,
deadline_s, counts, gpus, zero_stage, recompute, optimizer; a missing one takes
PlanRequest's default. `perf` (the speed model's parameters) is not the job's to set and is
not stored. `sizing_of` writes the canonical form the API stores: every field, the model by
name when it is a packaged one. `plan_request_from(sizing_of(r)) == r` for every valid
request, and `plan_request_from` refuses anything else with a SizingError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpupool.errors import SpecError
from gpupool.sizing.catalog import normalise
from gpupool.sizing.memory import BYTES_PER_ELEM, OPTIMIZERS, RECOMPUTE, TRAINING_PRECISIONS
from gpupool.sizing.planner import TASKS, PlanRequest
from gpupool.sizing.shapes import ModelShape, load_shapes

if TYPE_CHECKING:
    from gpupool.domain.job_fields import JobFields

# Bounds: generous for any real model and job, finite so that the planner's arithmetic
# stays finite (the scheduler sizes a job with them on every cycle it waits).
MAX_SEQ_TOKENS = 10_000_000
"""context and seq_len: tokens per sequence."""
MAX_BATCH = 100_000
MAX_GRAD_ACCUM = 100_000
MAX_TOKENS = 1e18
"""tokens: work to generate or train on."""
MAX_DEADLINE_S = 1e9
MAX_COUNT = 1024
"""Largest GPU count to try (as the API's gpus)."""
MAX_COUNTS = 16
MAX_GPU_TYPES = 64
MAX_NAME = 64
"""GPU type names."""
SHAPE_INTS: dict[str, int] = {
    "layers": 10_000,
    "hidden": 1_000_000,
    "heads": 100_000,
    "kv_heads": 100_000,
    "head_dim": 100_000,
    "vocab": 100_000_000,
    "ffn_hidden": 10_000_000,
}
"""Whole-number shape fields and their largest values (all at least 1)."""
MAX_PARAMS_B = 1e6
MAX_SHAPE_NAME = 128
MAX_SHAPE_SOURCE = 1024
SHAPE_FIELDS = ("name", "params_b", "active_params_b", *SHAPE_INTS, "source")
REQUIRED_SHAPE = ("layers", "hidden", "heads")

INTS: dict[str, tuple[int, int]] = {
    "context": (1, MAX_SEQ_TOKENS),
    "seq_len": (1, MAX_SEQ_TOKENS),
    "batch": (1, MAX_BATCH),
    "grad_accum": (1, MAX_GRAD_ACCUM),
    "zero_stage": (0, 3),
}
FLOATS: dict[str, float] = {"tokens": MAX_TOKENS, "deadline_s": MAX_DEADLINE_S}
"""Optional numbers: more than 0 and at most this, or None."""
CHOICES: dict[str, tuple[str, ...]] = {
    "task": TASKS,
    "precision": tuple(BYTES_PER_ELEM),
    "kv_precision": tuple(BYTES_PER_ELEM),
    "recompute": RECOMPUTE,
    "optimizer": OPTIMIZERS,
}
NULLABLE = frozenset({"kv_precision", "tokens", "deadline_s", "gpus"})
FIELDS = (
    "model",
    "shape",
    "task",
    "precision",
    "kv_precision",
    "context",
    "seq_len",
    "batch",
    "grad_accum",
    "tokens",
    "deadline_s",
    "counts",
    "gpus",
    "zero_stage",
    "recompute",
    "optimizer",
)
"""The keys a sizing mapping may hold: PlanRequest's fields, with model or shape for shape."""
DEFAULTS: dict[str, Any] = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in dataclasses.fields(PlanRequest)
    if f.name in FIELDS and f.name != "shape"
}
"""What a field missing from a mapping means: PlanRequest's defaults, as JSON."""


class SizingError(SpecError):
    """A sizing mapping the planner cannot take; `loc` is the path to the offending field
    within the mapping (() for the mapping as a whole)."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        self.loc = loc
        self.reason = message
        super().__init__(f"sizing.{'.'.join(loc)}: {message}" if loc else f"sizing: {message}")


def model_names() -> tuple[str, ...]:
    """The packaged models a sizing mapping may name."""
    return tuple(load_shapes())


def check_model(name: object) -> str:
    """A packaged model's exact name, or a SizingError listing them (suggesting the one a
    differently spelt name means)."""
    shapes = load_shapes()
    if isinstance(name, str) and name in shapes:
        return name
    hint = ""
    if isinstance(name, str):
        for known in shapes:
            if normalise(known) == normalise(name):
                hint = f" (did you mean {known!r}?)"
    raise SizingError(
        ("model",),
        f"unknown model {name!r}{hint}; known models: {', '.join(shapes)} "
        "(or give the shape instead: layers, hidden, heads, ...)",
    )


def check_choice(key: str, value: object) -> str:
    """One of CHOICES[key], or a SizingError listing them."""
    choices = CHOICES[key]
    if isinstance(value, str) and value in choices:
        return value
    raise SizingError((key,), f"unknown {key} {value!r}; choose from {', '.join(choices)}")


def sizing_of(request: PlanRequest) -> dict[str, Any]:
    """The canonical mapping of a request: every field; the model by name if packaged."""
    out: dict[str, Any] = {}
    if load_shapes().get(request.shape.name) == request.shape:
        out["model"] = request.shape.name
    else:
        out["shape"] = {k: getattr(request.shape, k) for k in SHAPE_FIELDS}
    out.update(
        task=request.task,
        precision=request.precision,
        kv_precision=request.kv_precision,
        context=request.context,
        seq_len=request.seq_len,
        batch=request.batch,
        grad_accum=request.grad_accum,
        tokens=request.tokens,
        deadline_s=request.deadline_s,
        counts=list(request.counts),
        gpus=None if request.gpus is None else list(request.gpus),
        zero_stage=request.zero_stage,
        recompute=request.recompute,
        optimizer=request.optimizer,
    )
    return out


def plan_request_of(job: JobFields) -> PlanRequest | None:
    """The PlanRequest a job (a stored one: a JobRow) was submitted with; None for a job
    given by GPU count."""
    return None if job.sizing is None else plan_request_from(job.sizing)


def plan_request_from(sizing: Mapping[str, Any]) -> PlanRequest:
    """Build the PlanRequest a sizing mapping describes; SizingError names what is wrong."""
    if not isinstance(sizing, Mapping):
        raise SizingError((), f"must be a mapping of the planner's fields, not {_kind(sizing)}")
    for key in sizing:
        if key not in FIELDS:
            raise SizingError((str(key),), f"unknown field; known fields: {', '.join(FIELDS)}")
    model, shape = sizing.get("model"), sizing.get("shape")
    if model is not None and shape is not None:
        raise SizingError(("shape",), "give model or shape, not both")
    if model is None and shape is None:
        raise SizingError(
            ("model",), f"give a model ({', '.join(load_shapes())}) or its shape; neither is set"
        )
    given: dict[str, Any] = {
        "shape": load_shapes()[check_model(model)] if model is not None else shape_from(shape)
    }
    for key, value in sizing.items():
        if key in ("model", "shape"):
            continue
        if value is None and key in NULLABLE:
            given[key] = None
        elif key in CHOICES:
            given[key] = check_choice(key, value)
        elif key in INTS:
            given[key] = _int((key,), value, *INTS[key])
        elif key in FLOATS:
            given[key] = _positive((key,), value, FLOATS[key])
        elif key == "counts":
            given[key] = tuple(_ints(("counts",), value, MAX_COUNTS, MAX_COUNT))
        elif key == "gpus":
            given[key] = tuple(_names(("gpus",), value))
    task = given.get("task", "inference")
    precision = given.get("precision", "bf16")
    if task == "training" and precision not in TRAINING_PRECISIONS:
        raise SizingError(
            ("precision",),
            f"training in {precision} is not modelled; choose from "
            f"{', '.join(TRAINING_PRECISIONS)}",
        )
    if given.get("deadline_s") is not None and given.get("tokens") is None:
        raise SizingError(("deadline_s",), "a deadline needs the amount of work: give tokens")
    try:
        return PlanRequest(**given)
    except SpecError as err:  # a rule checked above should have caught it first
        raise SizingError((), str(err)) from None


def shape_from(shape: object) -> ModelShape:
    """A ModelShape from its fields (layers, hidden, heads required); the missing ones take
    ModelShape.custom's usual choices."""
    if not isinstance(shape, Mapping):
        raise SizingError(
            ("shape",), f"must be a mapping of the shape's fields, not {_kind(shape)}"
        )
    for key in shape:
        if key not in SHAPE_FIELDS:
            raise SizingError(
                ("shape", str(key)), f"unknown field; known fields: {', '.join(SHAPE_FIELDS)}"
            )
    missing = [k for k in REQUIRED_SHAPE if shape.get(k) is None]
    if missing:
        raise SizingError(
            ("shape", missing[0]), f"required (a shape needs {', '.join(REQUIRED_SHAPE)})"
        )
    ints = {
        k: _int(("shape", k), shape[k], 1, top)
        for k, top in SHAPE_INTS.items()
        if shape.get(k) is not None
    }
    floats = {
        k: _positive(("shape", k), shape[k], MAX_PARAMS_B)
        for k in ("params_b", "active_params_b")
        if shape.get(k) is not None
    }
    texts = {
        k: _text(("shape", k), shape[k], top)
        for k, top in (("name", MAX_SHAPE_NAME), ("source", MAX_SHAPE_SOURCE))
        if shape.get(k) is not None
    }
    try:
        return ModelShape.custom(
            layers=ints["layers"],
            hidden=ints["hidden"],
            heads=ints["heads"],
            kv_heads=ints.get("kv_heads"),
            head_dim=ints.get("head_dim"),
            vocab=ints.get("vocab"),
            ffn_hidden=ints.get("ffn_hidden"),
            params_b=floats.get("params_b"),
            active_params_b=floats.get("active_params_b"),
            name=texts.get("name", "custom"),
            source=texts.get("source", "custom shape"),
        )
    except SpecError as err:
        raise SizingError(("shape",), str(err).removeprefix("model shape: ")) from None


# ---- one value ------------------------------------------------------------------------------
def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _int(loc: tuple[str, ...], value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SizingError(loc, f"must be a whole number, not {_kind(value)}")
    if not lo <= value <= hi:
        raise SizingError(loc, f"must be within {lo}..{hi}, got {value}")
    return value


def _positive(loc: tuple[str, ...], value: object, hi: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise SizingError(loc, f"must be a number, not {_kind(value)}")
    number = float(value)
    if not (math.isfinite(number) and 0 < number <= hi):
        raise SizingError(loc, f"must be more than 0 and at most {hi:g}, got {value}")
    return number


def _text(loc: tuple[str, ...], value: object, longest: int) -> str:
    if not isinstance(value, str):
        raise SizingError(loc, f"must be a string, not {_kind(value)}")
    if not 1 <= len(value) <= longest or "\x00" in value:
        raise SizingError(loc, f"must be 1 to {longest} characters, without NUL")
    return value


def _items(loc: tuple[str, ...], value: object, most: int) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise SizingError(loc, f"must be a list, not {_kind(value)}")
    if not 1 <= len(value) <= most:
        raise SizingError(loc, f"must hold 1 to {most} items, got {len(value)}")
    return value


def _ints(loc: tuple[str, ...], value: object, most: int, hi: int) -> list[int]:
    return [_int((*loc, str(k)), v, 1, hi) for k, v in enumerate(_items(loc, value, most))]


def _names(loc: tuple[str, ...], value: object) -> list[str]:
    items = _items(loc, value, MAX_GPU_TYPES)
    return [_text((*loc, str(k)), v, MAX_NAME) for k, v in enumerate(items)]
