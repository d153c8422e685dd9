"""Model shapes: the few numbers of a transformer that decide its memory and compute.

The packaged shapes (`data/model_shapes.csv`) copy each model's published Hugging Face
`config.json` (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
intermediate_size, vocab_size); the `source` column says where every row came from. Any
other model is a `ModelShape.custom(...)` or a `parse_shape("params_b=70,layers=80,...")`.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpupool.errors import NotFoundError, SpecError
from gpupool.sizing.catalog import normalise

SHAPE_KEYS = (
    "name",
    "params_b",
    "active_params_b",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "ffn_hidden",
)
_INT_KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "ffn_hidden")
#: Llama-2's vocabulary; used only when a custom shape gives none.
DEFAULT_VOCAB = 32000


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer. `active_params_b` differs from `params_b` only for MoE
    models: every expert must sit in memory, but a token only runs through the active ones."""

    name: str
    params_b: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn_hidden: int
    source: str = ""
    active_params_b: float | None = None

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def active_params(self) -> float:
        """Parameters one token runs through (all of them for a dense model)."""
        return (self.active_params_b if self.active_params_b is not None else self.params_b) * 1e9

    def kv_bytes_per_token(self, bytes_per_elem: float) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes (facts.md §6)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_elem

    @staticmethod
    def custom(
        *,
        layers: int,
        hidden: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        vocab: int | None = None,
        ffn_hidden: int | None = None,
        params_b: float | None = None,
        active_params_b: float | None = None,
        name: str = "custom",
        source: str = "custom shape",
    ) -> ModelShape:
        """A shape from keyword values. Missing values take the usual choices: kv_heads =
        heads (multi-head attention), head_dim = hidden / heads, ffn_hidden = 8/3 hidden (a
        gated MLP as large as a 4h plain one), params from the shape (`estimate_params_b`)."""
        for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads)):
            if value <= 0:
                raise SpecError(f"model shape: {key} must be > 0, got {value}")
        kv = heads if kv_heads is None else kv_heads
        hd = hidden // heads if head_dim is None else head_dim
        if kv <= 0 or hd <= 0:
            raise SpecError("model shape: kv_heads and head_dim must be > 0")
        if heads % kv:
            raise SpecError(f"model shape: heads ({heads}) must be a multiple of kv_heads ({kv})")
        voc = DEFAULT_VOCAB if vocab is None else vocab
        ffn = round(8 * hidden / 3) if ffn_hidden is None else ffn_hidden
        if voc <= 0 or ffn <= 0:
            raise SpecError("model shape: vocab and ffn_hidden must be > 0")
        if params_b is None:
            params_b = estimate_params_b(layers, hidden, heads, kv, hd, voc, ffn)
        if params_b <= 0:
            raise SpecError(f"model shape: params_b must be > 0, got {params_b}")
        if active_params_b is not None and not 0 < active_params_b <= params_b:
            raise SpecError(
                f"model shape: active_params_b ({active_params_b}) must be in (0, params_b]"
            )
        return ModelShape(
            name=name,
            params_b=params_b,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv,
            head_dim=hd,
            vocab=voc,
            ffn_hidden=ffn,
            source=source,
            active_params_b=active_params_b,
        )


def estimate_params_b(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, vocab: int, ffn: int
) -> float:
    """Parameters of a Llama-style model (untied embeddings, gated MLP, no biases), billions.

    Per layer: Q and O are hidden x heads*head_dim, K and V hidden x kv_heads*head_dim, the
    MLP three hidden x ffn matrices, plus two norms. It reproduces the published counts of
    Llama-3-8B (8.03B) and Llama-3-70B (70.55B) exactly.
    """
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * ffn + 2 * hidden
    return (2 * vocab * hidden + layers * per_layer + hidden) / 1e9


def parse_shape(text: str) -> ModelShape:
    """'params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8' -> ModelShape."""
    values: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise SpecError(f"--shape: {part!r} is not key=value; e.g. layers=80")
        if key not in SHAPE_KEYS:
            raise SpecError(f"--shape: unknown key {key!r}; known keys: {', '.join(SHAPE_KEYS)}")
        values[key] = value.strip()
    missing = [k for k in ("layers", "hidden", "heads") if k not in values]
    if missing:
        raise SpecError(
            f"--shape needs {', '.join(missing)}; e.g. "
            "'params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8'"
        )
    ints: dict[str, int] = {}
    for key in _INT_KEYS:
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError:
                raise SpecError(
                    f"--shape: {key} must be a whole number, got {values[key]!r}"
                ) from None
    floats: dict[str, float] = {}
    for key in ("params_b", "active_params_b"):
        if key in values:
            try:
                floats[key] = float(values[key])
            except ValueError:
                raise SpecError(f"--shape: {key} must be a number, got {values[key]!r}") from None
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
        name=values.get("name", "custom"),
        source=f"--shape {text}",
    )


def packaged_shapes_path() -> Path:
    return Path(str(resources.files("gpupool") / "data" / "model_shapes.csv"))


@functools.lru_cache(maxsize=1)
def load_shapes() -> dict[str, ModelShape]:
    """The packaged shapes by name, in file order."""
    path = packaged_shapes_path()
    shapes: dict[str, ModelShape] = {}
    with path.open(encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            try:
                shape = ModelShape(
                    name=row["name"],
                    params_b=float(row["params_b"]),
                    active_params_b=float(row["active_params_b"]),
                    source=row["source"],
                    **{k: int(row[k]) for k in _INT_KEYS},
                )
            except (KeyError, ValueError) as exc:
                raise SpecError(f"{path}:{reader.line_num}: bad model shape row ({exc})") from None
            shapes[shape.name] = shape
    return shapes


def shape_names() -> list[str]:
    return list(load_shapes())


def get_shape(name: str) -> ModelShape:
    """A packaged shape by name (case and separators do not matter: 'Llama-3-70B')."""
    shapes = load_shapes()
    if name in shapes:
        return shapes[name]
    wanted = normalise(name)
    for key, shape in shapes.items():
        if normalise(key) == wanted:
            return shape
    raise NotFoundError(
        f"unknown model {name!r}; known models: {', '.join(shapes)} "
        "(or describe it with --shape 'params_b=...,layers=...,hidden=...,heads=...')"
    )
