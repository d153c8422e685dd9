"""How much GPU memory a model needs, for serving and for training (facts.md §6).

Sources, as collected in shared/reference/facts.md §6:

* Weights: params x bytes per parameter. EleutherAI "Transformer Math 101"
  (blog.eleuther.ai/transformer-math) puts total inference memory at about 1.2 x the weights.
  We book that 20% as `activations_gib` (activations and framework buffers), so it splits
  across tensor-parallel GPUs like the weights it scales with.
* KV cache: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes (vLLM paper,
  Kwon et al., SOSP '23, arXiv 2309.06180: OPT-13B needs 800 KB per token).
* Runtime: the CUDA context and allocator take 300 MiB to 2 GiB per process
  (vram.asmirnov.xyz); we charge 1 GiB on every GPU, never split.
* Training model states: ZeRO (Rajbhandari et al.) counts (2 + 2 + K) bytes per parameter
  for mixed-precision Adam, K = 12 (FP32 master weights, momentum, variance): 16 B/param,
  so 7.5B parameters need 120 GB. 8-bit Adam (bitsandbytes) keeps 2 B/param of state
  instead of 8. ZeRO stage 1 shards the optimizer states across data-parallel GPUs, stage 2
  also the gradients, stage 3 also the weights.
* Activations: Korthikanti et al. 2022 (arXiv 2205.05198), per layer in 16-bit:
  s*b*h*(34 + 5*a*s/h) bytes without recomputation, 34*s*b*h with selective recomputation,
  2*s*b*h with full recomputation; tensor parallelism with sequence parallelism divides
  them by t.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpupool.errors import SpecError
from gpupool.sizing.shapes import ModelShape

GIB = float(2**30)

#: Bytes per element by precision (facts.md §6; 4-bit ignores the small scale tensors).
BYTES_PER_ELEM: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adam", "adam8bit", "sgd")
RECOMPUTE = ("none", "selective", "full")

#: Transformer Math 101: inference needs about 1.2 x the weights.
INFERENCE_EXTRA_FRACTION = 0.2
#: CUDA context + allocator per GPU: 300 MiB to 2 GiB (facts.md §6); the middle of the range.
CUDA_CONTEXT_GIB = 1.0
#: Optimizer state bytes per parameter, beyond an FP32 master copy: Adam keeps momentum and
#: variance in FP32 (8), bitsandbytes 8-bit Adam 2, SGD with momentum 4.
OPTIMIZER_STATE_BYTES = {"adam": 8.0, "adam8bit": 2.0, "sgd": 4.0}
#: FP32 master weights kept by mixed-precision training (ZeRO's K = 12 = 4 + 8 for Adam).
MASTER_WEIGHT_BYTES = 4.0


def bytes_per_elem(precision: str) -> float:
    try:
        return BYTES_PER_ELEM[precision.lower()]
    except KeyError:
        raise SpecError(
            f"unknown precision {precision!r}; choose from {', '.join(BYTES_PER_ELEM)}"
        ) from None


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of one model replica, by part, in GiB. `task` and `zero_stage` say how the
    parts split when the job runs on several GPUs (`per_gpu`)."""

    weights_gib: float
    kv_cache_gib: float
    activations_gib: float
    overhead_gib: float
    total_gib: float
    gradients_gib: float = 0.0
    optimizer_gib: float = 0.0
    task: str = "inference"
    zero_stage: int = 0
    kv_heads: int = 0

    @property
    def model_states_gib(self) -> float:
        """Weights + gradients + optimizer states (what ZeRO shards)."""
        return self.weights_gib + self.gradients_gib + self.optimizer_gib

    def per_gpu(self, count: int, tensor_parallel: int | None = None) -> MemoryEstimate:
        """The share of one GPU when the job runs on `count` GPUs.

        Inference: weights, KV cache and activations split over the `count` GPUs (tensor
        parallel); a GPU keeps at least one whole KV head, so past kv_heads GPUs the KV cache
        is replicated rather than split. Training: tensor parallel `t` (default 1) divides
        model states and activations; the remaining count / t data-parallel GPUs shard the
        model states by ZeRO stage. The CUDA context is paid on every GPU.
        """
        if count < 1:
            raise SpecError(f"GPU count must be at least 1, got {count}")
        if self.task == "inference":
            t = count if tensor_parallel is None else tensor_parallel
            if t < 1 or count % t:
                raise SpecError(f"tensor parallel {t} must divide the GPU count {count}")
            kv_share = 1 / count
            if self.kv_heads and t > self.kv_heads:
                kv_share = (1 / self.kv_heads) * (t / count)
            return _make(
                self,
                weights=self.weights_gib / count,
                kv=self.kv_cache_gib * kv_share,
                activations=self.activations_gib / count,
                grads=0.0,
                optimizer=0.0,
            )
        t = 1 if tensor_parallel is None else tensor_parallel
        if t < 1 or count % t:
            raise SpecError(f"tensor parallel {t} must divide the GPU count {count}")
        dp = count // t
        weights = self.weights_gib / t
        grads = self.gradients_gib / t
        optimizer = self.optimizer_gib / t
        if self.zero_stage >= 1:
            optimizer /= dp
        if self.zero_stage >= 2:
            grads /= dp
        if self.zero_stage >= 3:
            weights /= dp
        return _make(
            self,
            weights=weights,
            kv=0.0,
            activations=self.activations_gib / t,
            grads=grads,
            optimizer=optimizer,
        )


def _make(
    base: MemoryEstimate,
    *,
    weights: float,
    kv: float,
    activations: float,
    grads: float,
    optimizer: float,
) -> MemoryEstimate:
    total = weights + kv + activations + grads + optimizer + base.overhead_gib
    return replace(
        base,
        weights_gib=weights,
        kv_cache_gib=kv,
        activations_gib=activations,
        gradients_gib=grads,
        optimizer_gib=optimizer,
        total_gib=total,
    )


def kv_cache_bytes(
    shape: ModelShape, context_tokens: int, batch: int, kv_precision: str = "bf16"
) -> float:
    """2 x layers x kv_heads x head_dim x tokens x batch x bytes (vLLM paper; facts.md §6)."""
    return shape.kv_bytes_per_token(bytes_per_elem(kv_precision)) * context_tokens * batch


def inference_memory(
    shape: ModelShape,
    precision: str = "bf16",
    context_tokens: int = 4096,
    batch: int = 1,
    kv_precision: str | None = None,
) -> MemoryEstimate:
    """Serving memory for `batch` sequences of `context_tokens` each, whole model.

    weights = params x bytes; activations = 20% of weights (Transformer Math 101's 1.2x);
    KV cache for every token of every sequence (the cache must hold the full context);
    overhead = one CUDA context. KV precision defaults to the weights' precision, but never
    below 1 byte: int4 weights still keep an 8-bit (or wider) cache.
    """
    _check_positive(context_tokens=context_tokens, batch=batch)
    bpe = bytes_per_elem(precision)
    if kv_precision is None:
        kv_precision = precision if bpe >= 1 else "fp8"
    weights = shape.params * bpe / GIB
    kv = kv_cache_bytes(shape, context_tokens, batch, kv_precision) / GIB
    activations = INFERENCE_EXTRA_FRACTION * weights
    return MemoryEstimate(
        weights_gib=weights,
        kv_cache_gib=kv,
        activations_gib=activations,
        overhead_gib=CUDA_CONTEXT_GIB,
        total_gib=weights + kv + activations + CUDA_CONTEXT_GIB,
        task="inference",
        kv_heads=shape.kv_heads,
    )


def activation_bytes(
    shape: ModelShape,
    seq_len: int,
    micro_batch: int,
    recompute: str = "selective",
    precision: str = "bf16",
) -> float:
    """Activation memory of one micro-batch, whole model (Korthikanti et al. 2022).

    Per layer (16-bit): none s*b*h*(34 + 5*a*s/h); selective 34*s*b*h; full 2*s*b*h plus, once,
    the 34*s*b*h of the one layer being recomputed during backward. On top, the loss keeps
    the logits in FP32: 4*s*b*vocab (the paper's output-layer term; our addition to facts.md).
    FP32 training doubles the 16-bit figures.
    """
    if recompute not in RECOMPUTE:
        raise SpecError(f"unknown recompute {recompute!r}; choose from {', '.join(RECOMPUTE)}")
    _check_positive(seq_len=seq_len, micro_batch=micro_batch)
    s, b, h, a = float(seq_len), float(micro_batch), float(shape.hidden), float(shape.heads)
    scale = bytes_per_elem(precision) / 2.0
    sbh = s * b * h
    if recompute == "none":
        layers = shape.layers * sbh * (34.0 + 5.0 * a * s / h)
    elif recompute == "selective":
        layers = shape.layers * 34.0 * sbh
    else:
        layers = shape.layers * 2.0 * sbh + 34.0 * sbh
    logits = 4.0 * s * b * shape.vocab
    return layers * scale + logits


def training_memory(
    shape: ModelShape,
    precision: str = "bf16",
    seq_len: int = 4096,
    micro_batch: int = 1,
    optimizer: str = "adam",
    recompute: str = "selective",
    zero_stage: int = 0,
) -> MemoryEstimate:
    """Training memory of the whole model on one GPU; `per_gpu` splits it.

    Mixed precision (bf16/fp16): weights 2 + gradients 2 + FP32 master 4 + optimizer states
    (Adam 8) = 16 B/param, ZeRO's (2 + 2 + K) with K = 12. FP32 training has no master copy:
    4 + 4 + 8 = 16 as well. MoE models keep states for every expert (total params).
    """
    if precision not in TRAINING_PRECISIONS:
        raise SpecError(
            f"training precision {precision!r} is not supported; choose from "
            f"{', '.join(TRAINING_PRECISIONS)} (quantised training such as QLoRA is not modelled)"
        )
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    if zero_stage not in (0, 1, 2, 3):
        raise SpecError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    bpe = bytes_per_elem(precision)
    master = MASTER_WEIGHT_BYTES if bpe < 4 else 0.0
    weights = shape.params * bpe / GIB
    grads = shape.params * bpe / GIB
    opt = shape.params * (master + OPTIMIZER_STATE_BYTES[optimizer]) / GIB
    acts = activation_bytes(shape, seq_len, micro_batch, recompute, precision) / GIB
    return MemoryEstimate(
        weights_gib=weights,
        kv_cache_gib=0.0,
        activations_gib=acts,
        overhead_gib=CUDA_CONTEXT_GIB,
        total_gib=weights + grads + opt + acts + CUDA_CONTEXT_GIB,
        gradients_gib=grads,
        optimizer_gib=opt,
        task="training",
        zero_stage=zero_stage,
        kv_heads=shape.kv_heads,
    )


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise SpecError(f"{key} must be at least 1, got {value}")
