"""Right-sizing: GPU catalogue, model shapes, memory and speed estimates, and the planner.

from gpupool.sizing import PlanRequest, get_shape, load_catalog, plan
options = plan(PlanRequest(get_shape("llama-3-70b"), context=8192, batch=16))
"""

from gpupool.sizing.catalog import Catalog, GpuType, load_catalog
from gpupool.sizing.memory import MemoryEstimate, inference_memory, training_memory
from gpupool.sizing.perf import PerfParams, decode_tokens_per_s, prefill_s, training_step
from gpupool.sizing.planner import PlanOption, PlanRequest, min_gpus, plan, sized_options
from gpupool.sizing.shapes import ModelShape, get_shape, parse_shape

__all__ = [
    "Catalog",
    "GpuType",
    "MemoryEstimate",
    "ModelShape",
    "PerfParams",
    "PlanOption",
    "PlanRequest",
    "decode_tokens_per_s",
    "get_shape",
    "inference_memory",
    "load_catalog",
    "min_gpus",
    "parse_shape",
    "plan",
    "prefill_s",
    "sized_options",
    "training_memory",
    "training_step",
]
