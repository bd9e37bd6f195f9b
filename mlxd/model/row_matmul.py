"""Where the `+rows` modes of `--batched-attention` send a batched decode step's projections:
rows_kernel.py's few-row kernel instead of cuBLASLt (docs/performance.md, session 25).

The wrappers replace the module they wrap in a shallow copy of its parent (folded()), so a
shadow model's parameter tree lists every weight once; anything but a batched one-token step
goes to the wrapped module, op for op.
"""

import copy
import os
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import rows_kernel

PARTS = ("qkv", "o", "gate_up", "down", "head")


def parts() -> frozenset[str]:
    """The projections the +rows modes route (MLXD_ROWS_PARTS, comma-separated; default all):
    a knob for probes that time each part's kernel in the whole step."""
    chosen = os.environ.get("MLXD_ROWS_PARTS")
    return frozenset(PARTS if chosen is None else chosen.split(","))


def few_rows(x: mx.array) -> bool:
    """A batched decode step's input: several rows of one token each."""
    return x.ndim == 3 and x.shape[1] == 1 and x.shape[0] >= 2


class RowsMatmul:
    """x @ weight.T through the few-row kernel for a batched step's (rows, 1, K) input."""

    def __init__(self, weight: mx.array) -> None:
        self.weight = weight

    def __call__(self, x: mx.array) -> mx.array:
        return rows_kernel.rows_matmul(x, self.weight)


def routable(linear: Any) -> bool:
    """An unquantized Linear whose weight the kernel takes (quantized ones have MLX's own
    kernels, no cuBLASLt)."""
    return type(linear) is nn.Linear and rows_kernel.supports(linear.weight)


class RowsLinear(nn.Module):
    """Wraps one Linear: a batched decode step's rows go through RowsMatmul (plus the bias)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._rows = RowsMatmul(inner.weight)

    def __call__(self, x: mx.array) -> mx.array:
        if not few_rows(x):
            return self.inner(x)
        y = self._rows(x)
        return y + self.inner.bias if "bias" in self.inner else y


class RowsEmbedding(nn.Module):
    """A tied embedding whose `as_linear` (the output head) runs a batched decode step's rows
    through RowsMatmul; lookups go to the embedding itself."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._rows = RowsMatmul(inner.weight)

    def __call__(self, x: mx.array) -> mx.array:
        return self.inner(x)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._rows(x) if few_rows(x) else self.inner.as_linear(x)


def with_rows(module: Any, name: str) -> Any:
    """A shallow copy of `module` whose Linear `name` is wrapped in RowsLinear (the module
    itself where the kernel cannot take that Linear)."""
    if not routable(linear := getattr(module, name)):
        return module
    twin = copy.copy(module)
    setattr(twin, name, RowsLinear(linear))
    return twin


def rows_head(model: Any, inner: Any) -> None:
    """Route the output head of `model` (a shallow copy whose `.model` is `inner`, also a copy)
    through RowsMatmul: the tied embedding's `as_linear`, or the lm_head Linear."""
    if getattr(model.args, "tie_word_embeddings", False):
        emb = inner.embed_tokens
        if type(emb) is nn.Embedding and rows_kernel.supports(emb.weight):
            inner.embed_tokens = RowsEmbedding(emb)
    elif "lm_head" in model and routable(model.lm_head):
        model.lm_head = RowsLinear(model.lm_head)
