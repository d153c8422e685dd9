"""Roofline speed estimates and a communication model by interconnect class (facts.md §5).

Nothing here is measured on the job: these are first-order estimates for choosing a GPU
type and count. Each default says where it comes from; all are parameters (`PerfParams`).

* Decode is memory-bound: every step reads the weights and the whole KV cache once, at a
  fraction of peak bandwidth, and pays two small all-reduces per layer under tensor parallel.
* Prefill and training are compute-bound: 2*P FLOPs per token forward, 6*P forward+backward
  (8*P with full recomputation), at a model-FLOPs utilisation (MFU).
* Data-parallel gradients use facts.md §5's ring all-reduce,
  t_ar(N) = 2(N-1)/N * G / busbw + 2(N-1)*alpha, hidden behind backward by an overlap o:
  t(N) = t_c + max(0, t_ar - o*t_bwd). Efficiency is then capped by the class's measured
  ceiling at that GPU count (facts.md §5 default efficiency table), which is what makes
  consumer PCIe without P2P fall off with N even for compute-heavy jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpupool.errors import SpecError
from gpupool.sizing.catalog import GpuType
from gpupool.sizing.memory import RECOMPUTE, bytes_per_elem
from gpupool.sizing.shapes import ModelShape


@dataclass(frozen=True)
class LinkModel:
    """How one interconnect class behaves in collectives.

    overlap: share of backward time that hides gradient all-reduce (facts.md §5: 0.7-0.9 for
    bucketed DDP/FSDP). alpha_s: latency per ring hop (facts.md §5: 5-10 us). ceiling: the
    best data-parallel efficiency seen at 1, 2, 4 and 8 GPUs (upper ends of facts.md §5's
    default efficiency table).
    """

    overlap: float
    alpha_s: float
    ceiling: tuple[float, float, float, float]


#: facts.md §5 "default efficiency table" upper ends; overlap and alpha per class.
#: pcie-host: overlap 0.5 and alpha 100 us are our assumptions (host-staged copies compete
#: with compute); alpha is chosen so tensor parallel over consumer PCIe gives no speed-up for
#: small models, as reported (exllamav2#734, vllm#1873).
LINKS: Mapping[str, LinkModel] = MappingProxyType(
    {
        "nvswitch": LinkModel(0.8, 5e-6, (1.0, 1.0, 0.99, 0.98)),
        "xgmi": LinkModel(0.8, 5e-6, (1.0, 1.0, 0.99, 0.98)),
        "nvlink-bridge": LinkModel(0.8, 5e-6, (1.0, 0.95, 0.92, 0.90)),
        "pcie-p2p": LinkModel(0.7, 10e-6, (1.0, 0.95, 0.92, 0.90)),
        "pcie-host": LinkModel(0.5, 100e-6, (1.0, 0.90, 0.80, 0.70)),
    }
)
#: All-reduce bus bandwidth once a ring leaves an NVLink-bridged pair and crosses the PCIe
#: host: 20 GB/s (NVIDIA/nccl-tests#178).
PCIE_FALLBACK_BUSBW_GB_S = 20.0
#: GPUs in one NVLink/PCIe domain. Beyond it we assume 400 Gb/s InfiniBand per GPU at 80%
#: (40 GB/s busbw): an assumption, facts.md has no inter-node figure.
GPUS_PER_NODE = 8
INTER_NODE_BUSBW_GB_S = 40.0


@dataclass(frozen=True)
class PerfParams:
    """Defaults for the speed model; every one can be changed per request.

    decode_bw_efficiency 0.75: share of peak memory bandwidth a decode step achieves (an
    assumption, the middle of the usual 0.7-0.8). mfu 0.5: model FLOPs utilisation for
    prefill and training (facts.md §5: the worked example uses 50%; Megatron-LM on 3,072
    A100s reached about 50% of peak). step_overhead_s 3 ms per decode step and
    collective_launch_s 20 us per all-reduce are scheduling and kernel-launch costs fitted,
    with small-message latency 2*log2(N)*alpha (tree), to the vLLM TP measurements
    (vllm#16300: 36.2 / 50 / 63 tok/s at TP 2 / 4 / 8 on A100).
    """

    decode_bw_efficiency: float = 0.75
    mfu: float = 0.5
    step_overhead_s: float = 3e-3
    collective_launch_s: float = 20e-6
    links: Mapping[str, LinkModel] = field(default_factory=lambda: LINKS)
    overlap: float | None = None

    def link(self, interconnect_class: str) -> LinkModel:
        try:
            return self.links[interconnect_class]
        except KeyError:
            raise SpecError(
                f"no link model for interconnect class {interconnect_class!r}; "
                f"known: {', '.join(self.links)}"
            ) from None


DEFAULT_PERF = PerfParams()


def peak_flops(gpu: GpuType, precision: str) -> float:
    """Dense peak FLOP/s for the math precision: FP32 at the FP32 rate, everything else at
    the BF16 tensor rate (8- and 4-bit weights are taken as dequantised to 16-bit math, which
    is conservative on GPUs with FP8 tensor cores)."""
    bytes_per_elem(precision)
    tflops = gpu.fp32_tflops if precision.lower() == "fp32" else gpu.bf16_tflops
    return tflops * 1e12


def link_for(gpu: GpuType, count: int, perf: PerfParams = DEFAULT_PERF) -> tuple[float, float]:
    """(bus bandwidth GB/s, per-hop latency s) of a collective over `count` GPUs of this type.

    A bridged pair talks over NVLink; a ring of more GPUs crosses the PCIe host. Past one
    node, inter-node links bound the ring.
    """
    link = perf.link(gpu.interconnect_class)
    busbw, alpha = gpu.allreduce_busbw_gb_s, link.alpha_s
    if gpu.interconnect_class == "nvlink-bridge" and count > 2:
        busbw = min(busbw, PCIE_FALLBACK_BUSBW_GB_S)
        alpha = max(alpha, perf.link("pcie-p2p").alpha_s)
    if count > GPUS_PER_NODE:
        busbw = min(busbw, INTER_NODE_BUSBW_GB_S)
        alpha = max(alpha, perf.link("pcie-p2p").alpha_s)
    return busbw, alpha


def allreduce_s(size_bytes: float, count: int, busbw_gb_s: float, alpha_s: float) -> float:
    """Ring all-reduce: 2(N-1)/N * G / busbw + 2(N-1)*alpha (facts.md §5)."""
    if count <= 1:
        return 0.0
    return 2 * (count - 1) / count * size_bytes / (busbw_gb_s * 1e9) + 2 * (count - 1) * alpha_s


def small_allreduce_s(
    size_bytes: float, count: int, busbw_gb_s: float, alpha_s: float, launch_s: float
) -> float:
    """An all-reduce of a few hundred KB (tensor-parallel activations in decode): NCCL uses
    tree/low-latency protocols there, so latency grows as 2*log2(N)*alpha, not 2(N-1)*alpha;
    plus a fixed launch cost. Bandwidth term as in the ring formula."""
    if count <= 1:
        return 0.0
    hops = 2 * math.ceil(math.log2(count))
    return launch_s + hops * alpha_s + 2 * (count - 1) / count * size_bytes / (busbw_gb_s * 1e9)


def efficiency_ceiling(
    interconnect_class: str, count: int, perf: PerfParams = DEFAULT_PERF
) -> float:
    """Best data-parallel efficiency at `count` GPUs for the class, interpolated on log2 N
    between facts.md §5's points at 1, 2, 4, 8; past 8 it keeps falling at the 4 -> 8 rate."""
    c = perf.link(interconnect_class).ceiling
    if count <= 1:
        return c[0]
    x = math.log2(count)
    if x >= 3:
        return max(0.3, c[3] - (c[2] - c[3]) * (x - 3))
    lo = int(x)
    frac = x - lo
    return c[lo] + (c[lo + 1] - c[lo]) * frac


def tp_valid(shape: ModelShape, tensor_parallel: int) -> bool:
    """Tensor parallel needs whole attention heads per GPU (as vLLM and Megatron require):
    heads divisible by t, and KV heads divisible by t or t a multiple of them (replicated)."""
    t = tensor_parallel
    if t <= 1:
        return True
    if shape.heads % t:
        return False
    return shape.kv_heads % t == 0 or t % shape.kv_heads == 0


@dataclass(frozen=True)
class DecodeEstimate:
    """One decode step of `batch` sequences on `count` GPUs (tensor parallel)."""

    step_s: float
    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    tokens_per_s: float


def decode(
    gpu: GpuType,
    count: int,
    shape: ModelShape,
    precision: str = "bf16",
    context: int = 4096,
    batch: int = 1,
    kv_precision: str | None = None,
    perf: PerfParams = DEFAULT_PERF,
) -> DecodeEstimate:
    """Decode throughput with `batch` sequences, each holding `context` tokens of cache.

    Bytes read per step = weights + KV cache of the batch (the full context: a conservative,
    end-of-generation figure). An MoE model reads min(all experts, active params x batch).
    Time = max(bytes / (count * bw * efficiency), 2 * active params * batch FLOPs / (count *
    peak * MFU)) + 2 all-reduces per layer of batch * hidden * 2 bytes + a per-step overhead.
    """
    _check(count=count, context=context, batch=batch)
    bpe = bytes_per_elem(precision)
    if kv_precision is None:
        kv_precision = precision if bpe >= 1 else "fp8"
    weight_bytes = min(shape.params, shape.active_params * batch) * bpe
    kv_bytes = shape.kv_bytes_per_token(bytes_per_elem(kv_precision)) * context * batch
    memory_s = (weight_bytes + kv_bytes) / (
        count * gpu.mem_bw_gb_s * 1e9 * perf.decode_bw_efficiency
    )
    compute_s = 2 * shape.active_params * batch / (count * peak_flops(gpu, precision) * perf.mfu)
    comm_s = 0.0
    if count > 1:
        busbw, alpha = link_for(gpu, count, perf)
        message = batch * shape.hidden * 2.0  # activations travel in 16-bit
        per = small_allreduce_s(message, count, busbw, alpha, perf.collective_launch_s)
        comm_s = 2 * shape.layers * per
    step_s = max(memory_s, compute_s) + comm_s + perf.step_overhead_s
    return DecodeEstimate(
        step_s=step_s,
        memory_s=memory_s,
        compute_s=compute_s,
        comm_s=comm_s,
        overhead_s=perf.step_overhead_s,
        tokens_per_s=batch / step_s,
    )


def decode_tokens_per_s(
    gpu: GpuType,
    count: int,
    shape: ModelShape,
    precision: str = "bf16",
    context: int = 4096,
    batch: int = 1,
    kv_precision: str | None = None,
    perf: PerfParams = DEFAULT_PERF,
) -> float:
    """Generated tokens per second for the whole batch (see `decode`)."""
    return decode(gpu, count, shape, precision, context, batch, kv_precision, perf).tokens_per_s


def prefill_s(
    gpu: GpuType,
    count: int,
    shape: ModelShape,
    precision: str = "bf16",
    context: int = 4096,
    batch: int = 1,
    perf: PerfParams = DEFAULT_PERF,
) -> float:
    """Time to read `batch` prompts of `context` tokens: compute-bound.

    FLOPs = batch * (2 * active params * context + 2 * layers * context^2 * heads * head_dim)
    (the second term is causal attention) over count * peak * MFU, plus two all-reduces per
    layer of context * batch * hidden * 2 bytes at the class's bus bandwidth.
    """
    _check(count=count, context=context, batch=batch)
    attention = 2.0 * shape.layers * context * context * shape.heads * shape.head_dim
    flops = batch * (2.0 * shape.active_params * context + attention)
    compute_s = flops / (count * peak_flops(gpu, precision) * perf.mfu)
    comm_s = 0.0
    if count > 1:
        busbw, alpha = link_for(gpu, count, perf)
        message = batch * context * shape.hidden * 2.0
        comm_s = 2 * shape.layers * allreduce_s(message, count, busbw, alpha)
    return compute_s + comm_s


@dataclass(frozen=True)
class TrainingEstimate:
    """One optimizer step: every data-parallel rank runs grad_accum micro-batches."""

    step_s: float
    compute_s: float
    tp_comm_s: float
    dp_comm_s: float
    exposed_dp_s: float
    efficiency: float
    tokens_per_step: int
    tokens_per_s: float


def training_step(
    gpu: GpuType,
    count: int,
    shape: ModelShape,
    precision: str = "bf16",
    seq_len: int = 4096,
    micro_batch: int = 1,
    grad_accum: int = 1,
    tensor_parallel: int = 1,
    zero_stage: int = 0,
    recompute: str = "selective",
    perf: PerfParams = DEFAULT_PERF,
) -> TrainingEstimate:
    """Step time of data-parallel (ZeRO) training, optionally with tensor parallel inside.

    compute = k * active params * tokens / (count * peak * MFU), k = 6 (8 with full
    recomputation, which reruns the forward). Gradients (params x bytes, / t) are
    all-reduced over the count / t data-parallel ranks; ZeRO-3 moves 1.5x that volume
    (ZeRO paper: 3 Psi instead of 2 Psi). The exposed part is max(0, t_ar - o * t_bwd),
    t_bwd = 2/3 of compute. Tensor parallel adds 4 all-reduces per layer per micro-batch
    (6 with full recomputation) of seq * micro_batch * hidden * 2 bytes, not overlapped.
    The efficiency t_c / t is then capped by the class ceiling at `count` GPUs.
    """
    _check(count=count, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum)
    if recompute not in RECOMPUTE:
        raise SpecError(f"unknown recompute {recompute!r}; choose from {', '.join(RECOMPUTE)}")
    t = tensor_parallel
    if t < 1 or count % t:
        raise SpecError(f"tensor parallel {t} must divide the GPU count {count}")
    dp = count // t
    tokens = seq_len * micro_batch * grad_accum * dp
    k = 8.0 if recompute == "full" else 6.0
    compute_s = k * shape.active_params * tokens / (count * peak_flops(gpu, precision) * perf.mfu)
    busbw, alpha = link_for(gpu, count, perf)
    link = perf.link(gpu.interconnect_class)
    overlap = link.overlap if perf.overlap is None else perf.overlap
    grad_bytes = shape.params * bytes_per_elem(precision) / t
    volume = 1.5 if zero_stage >= 3 else 1.0
    dp_comm_s = allreduce_s(grad_bytes * volume, dp, busbw, alpha)
    backward_s = compute_s * 2.0 / 3.0
    exposed_s = max(0.0, dp_comm_s - overlap * backward_s)
    tp_comm_s = 0.0
    if t > 1:
        per_layer = 6 if recompute == "full" else 4
        message = seq_len * micro_batch * shape.hidden * 2.0
        tp_comm_s = grad_accum * shape.layers * per_layer * allreduce_s(message, t, busbw, alpha)
    step_s = compute_s + tp_comm_s + exposed_s
    step_s = max(step_s, compute_s / efficiency_ceiling(gpu.interconnect_class, count, perf))
    return TrainingEstimate(
        step_s=step_s,
        compute_s=compute_s,
        tp_comm_s=tp_comm_s,
        dp_comm_s=dp_comm_s,
        exposed_dp_s=exposed_s,
        efficiency=compute_s / step_s,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step_s,
    )


def _check(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise SpecError(f"{key} must be at least 1, got {value}")
