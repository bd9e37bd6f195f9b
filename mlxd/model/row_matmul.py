"""Few-row projections through MLX's gather_mm kernel instead of cuBLASLt (opt-in: the
`+gemm` modes of `--batched-attention`).

On MLX-CUDA a matmul of 2+ rows builds a cuBLASLt descriptor and asks cuBLASLt's heuristic for
an algorithm on every call (MLX 0.32's `CublasGemm`), which is most of the ~30-40 µs a few-row
projection costs a host-bound step (docs/performance.md). `mx.gather_mm` with one weight and
fixed indices computes the same product in MLX's own CUTLASS kernel, looked up by name. CUDA
runs it in bf16 (the CPU's gather_mm takes float32 only), with another kernel's rounding, so
the mode is opt-in; on the CPU in float32 it gives the matmul's bits (tests/model).
"""

import copy
import os
from typing import Any

import mlx.core as mx
import mlx.nn as nn

PARTS = ("qkv", "o", "gate_up", "down", "head")


def parts() -> frozenset[str]:
    """The projections the +gemm modes route (MLXD_GEMM_PARTS, comma-separated; default all):
    a knob for probes that time each part's kernel in the whole step."""
    chosen = os.environ.get("MLXD_GEMM_PARTS")
    return frozenset(PARTS if chosen is None else chosen.split(","))


def available() -> str | None:
    """Why the +gemm modes cannot run here, or None."""
    if not mx.cuda.is_available():
        return "the +gemm modes of --batched-attention need MLX's CUDA backend"
    return None


def few_rows(x: mx.array) -> bool:
    """A batched decode step's input: several rows of one token each."""
    return x.ndim == 3 and x.shape[1] == 1 and x.shape[0] >= 2


class RowsMatmul:
    """x @ weight.T for a (rows, 1, K) input as one gather_mm over the weight's transposed
    view (no copy) with constant indices, so the call adds no index ops to the step."""

    def __init__(self, weight: mx.array) -> None:
        self.wt = mx.expand_dims(weight, 0).swapaxes(1, 2)  # (1, K, N): a view of the weight
        self.index = mx.zeros((1,), mx.uint32)
        mx.eval(self.wt, self.index)

    def __call__(self, x: mx.array) -> mx.array:
        B, _, K = x.shape
        y = mx.gather_mm(x.reshape(1, B, K), self.wt, self.index, self.index)
        return y.reshape(B, 1, -1)


def plain(linear: Any) -> bool:
    """An unquantized Linear (quantized ones have MLX's own kernels, no cuBLASLt)."""
    return type(linear) is nn.Linear


# The wrappers replace the module they wrap in a shallow copy of its parent (folded()), so a
# shadow model's parameter tree lists every weight once.
class RowsLinear(nn.Module):
    """Wraps one Linear: a batched decode step's rows go through RowsMatmul (plus the bias);
    anything else goes to the Linear itself."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._rows = RowsMatmul(inner.weight)

    def __call__(self, x: mx.array) -> mx.array:
        if not few_rows(x):
            return self.inner(x)
        y = self._rows(x)
        return y + self.inner.bias if "bias" in self.inner else y


def rows_linear(linear: Any) -> RowsLinear | None:
    """`linear` wrapped in RowsLinear where it is a plain Linear, else None."""
    return RowsLinear(linear) if plain(linear) else None


class RowsEmbedding(nn.Module):
    """A tied embedding whose `as_linear` (the output head) runs a batched decode step's rows
    through RowsMatmul; lookups and other inputs go to the embedding itself."""

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
    itself where that Linear is quantized)."""
    wrapped = rows_linear(getattr(module, name))
    if wrapped is None:
        return module
    twin = copy.copy(module)
    setattr(twin, name, wrapped)
    return twin


def rows_head(model: Any, inner: Any) -> None:
    """Route the output head of `model` (a shallow copy whose `.model` is `inner`, also a copy)
    through RowsMatmul: the tied embedding's `as_linear`, or the lm_head Linear."""
    if getattr(model.args, "tie_word_embeddings", False):
        if type(inner.embed_tokens) is nn.Embedding:
            inner.embed_tokens = RowsEmbedding(inner.embed_tokens)
    elif "lm_head" in model and (head := rows_linear(model.lm_head)) is not None:
        model.lm_head = head
