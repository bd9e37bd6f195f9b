"""Where the `+gemv` modes of `--batched-attention` send a batched decode step's projections:
MLX's own batched gemv instead of cuBLASLt (opt-in; docs/performance.md).

On MLX-CUDA, x (rows, 1, K) @ W.T is flattened into one (rows, K) matmul, which goes to
cuBLASLt: a descriptor, a heuristic query and a stream capture on every call, ~30-40 µs of host
time against ~15 µs for MLX's gemv. W broadcast to (rows, N, K) @ x as (rows, K, 1) is a batch
of matrix-vector products whose weight batch stride is 0, so MLX keeps it a batch and runs its
`gemv_batched` kernel: one launch, each row reading the weight again (from L2 when it fits,
hence the byte cap). Its float32 sums round otherwise than cuBLAS's, so it is opt-in.
"""

import copy
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..config import GEMV_PARTS, gemv_tuning
from .rows_step import HeldLinear

PARTS = GEMV_PARTS  # the head and the attention scores are off by default: not measured wins
# Weights above this go to cuBLASLt: every row re-reads the weight, which must stay in L2
# (the H200's is 50 MB).
MAX_BYTES = gemv_tuning().max_bytes


def parts() -> frozenset[str]:
    """The projections the +gemv modes route (MLXD_GEMV_PARTS; default qkv, o, gate_up,
    down): a knob for probes that time each part in the whole step. `qk`: the attention's
    scores too (`scores` below)."""
    return gemv_tuning().parts


def max_rows() -> int:
    """Rows up to which a step takes the gemv (MLXD_GEMV_ROWS, default 8). On the H200's 0.6B
    step, alternated: 0.85x at 2 rows, 0.91x at 8, 0.98x at 16, 1.23x at 32, where the weight
    re-reads cost the GPU more than cuBLASLt's host time (docs/performance.md)."""
    return gemv_tuning().rows


def few_rows(x: mx.array) -> bool:
    """A batched decode step's input: several rows of one token each."""
    return x.ndim == 3 and x.shape[1] == 1 and x.shape[0] >= 2


class GemvMatmul:
    """x @ weight.T as a batch of gemvs for a batched step's (rows, 1, K) input."""

    def __init__(self, weight: mx.array, cap: int | None = None) -> None:
        self.weight = weight
        self.cap = max_rows() if cap is None else cap
        self._wide: dict[int, mx.array] = {}  # rows -> the weight broadcast (a view, no copy)

    def takes(self, x: mx.array) -> bool:
        rows = few_rows(x) or (x.ndim == 2 and x.shape[0] >= 2)  # 2-D: rows_step.py's step
        return rows and x.shape[0] <= self.cap

    def __call__(self, x: mx.array) -> mx.array:
        B, K = x.shape[0], x.shape[-1]
        w = self._wide.get(B)
        if w is None:
            w = self._wide[B] = mx.broadcast_to(self.weight, (B, *self.weight.shape))
        return (w @ x.reshape(B, K, 1)).reshape(*x.shape[:-1], -1)


def scores(q: mx.array, k: mx.array) -> mx.array:
    """q (B, kv heads, group, D) against k (B, kv heads, L, D): q @ k.T per head as a batch of
    gemvs, each key row read by every query of its group through a stride-0 broadcast (a view),
    so MLX-CUDA runs `gemv_batched` instead of a cuBLASLt batched matmul. The CPU gives
    q @ k.T's bits (tested); on CUDA the sums round otherwise."""
    B, n_kv, G, D = q.shape
    keys = mx.broadcast_to(mx.expand_dims(k, 2), (B, n_kv, G, k.shape[2], D))
    return (keys @ q.reshape(B, n_kv, G, D, 1)).reshape(B, n_kv, G, -1)


def fits(weight: mx.array) -> bool:
    return weight.nbytes <= MAX_BYTES


def routable(linear: Any) -> bool:
    """An unquantized Linear whose weight fits the cap (quantized ones have MLX's own kernels,
    no cuBLASLt)."""
    return type(linear) is nn.Linear and fits(linear.weight)


class GemvLinear(nn.Module):
    """Wraps one Linear: a batched decode step's rows go through GemvMatmul (plus the bias)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._gemv = GemvMatmul(inner.weight)
        self._held = HeldLinear(inner)

    def __call__(self, x: mx.array) -> mx.array:
        if not self._gemv.takes(x):  # 2-D rows: the rows step's held transpose (rows_step.py)
            return self._held(x) if x.ndim == 2 else self.inner(x)
        y = self._gemv(x)
        return y + self.inner.bias if "bias" in self.inner else y


class GemvEmbedding(nn.Module):
    """A tied embedding whose `as_linear` (the output head) runs a batched decode step's rows
    through GemvMatmul; lookups go to the embedding itself."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._gemv = GemvMatmul(inner.weight)

    def __call__(self, x: mx.array) -> mx.array:
        return self.inner(x)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._gemv(x) if self._gemv.takes(x) else self.inner.as_linear(x)


def with_gemv(module: Any, name: str) -> Any:
    """A shallow copy of `module` whose Linear `name` is wrapped in GemvLinear (the module
    itself where that Linear is not routable)."""
    if not routable(linear := getattr(module, name)):
        return module
    twin = copy.copy(module)
    setattr(twin, name, GemvLinear(linear))
    return twin


def gemv_head(model: Any, inner: Any) -> None:
    """Route the output head of `model` (a shallow copy whose `.model` is `inner`, also a copy)
    through GemvMatmul: the tied embedding's `as_linear`, or the lm_head Linear. No byte cap:
    the probe knob MLXD_GEMV_PARTS=...,head asks for it explicitly."""
    if getattr(model.args, "tie_word_embeddings", False):
        if type(emb := inner.embed_tokens) is nn.Embedding:
            inner.embed_tokens = GemvEmbedding(emb)
    elif "lm_head" in model and type(model.lm_head) is nn.Linear:
        model.lm_head = GemvLinear(model.lm_head)
