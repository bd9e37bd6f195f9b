"""The folded modes' batched decode step over 2-D rows, with fewer view nodes a layer.

A one-token step of B rows reaches each decoder block as (B, 1, D). In MLX each projection of
a 3-D input is a Flatten, the matmul and an Unflatten; each `weight.T` is a new Transpose node
on every call; each head split is a reshape and a transpose; each scalar or mask broadcast is a
Broadcast node: ~31 views a layer. A view launches no kernel, but MLX's eval still visits it on
the host (~1.3 µs each on the CI CPU), and the small models' step is host-bound
(docs/performance.md). Here a block's step runs on (B, D) rows: each weight's
transpose is made once (evaluated with the first step, it is a plain strided array after), the
heads are reshaped straight to (B, H, 1, D) and the attention's broadcast constants are held.
The memory order, the kernels and so the bits are the same (tests/model/test_rows_step.py).
"""

import functools
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu


class HeldLinear:
    """x @ W.T (plus the bias, as nn.Linear computes it) over a transpose of W made once: the
    same strides as the `.T` nn.Linear makes every call, so the same kernel and bits."""

    def __init__(self, linear: nn.Linear) -> None:
        self.bias = linear.bias if "bias" in linear else None
        self.wt = linear.weight.T

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.wt if self.bias is None else mx.addmm(self.bias, x, self.wt)


def held(linear: Any) -> Any:
    """A plain Linear as a HeldLinear; anything else (quantized layers, whose kernels take the
    weight untransposed, or the gemv wrapper) as it is."""
    return HeldLinear(linear) if type(linear) is nn.Linear else linear


class Projections:
    """An attention module's q, k, v and o projections, plain Linears held transposed."""

    def __init__(self, attn: Any) -> None:
        self.q, self.k, self.v, self.o = (
            held(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
        )


def heads_rows(a: Any, q: mx.array, k: mx.array, v: mx.array, cache: Any) -> tuple:
    """An attention module `a`'s one-token step from projected (B, H*D) rows to the keys and
    values in its cache: the heads reshaped straight to (B, H, 1, D) (the same memory order as
    mlx-lm's transposed (B, 1, H, D), since the token axis has length 1), qwen3's q/k norms,
    RoPE at the cache's offset, the cache update. Returns (q, keys, values)."""
    B = q.shape[0]
    q, k = q.reshape(B, a.n_heads, 1, -1), k.reshape(B, a.n_kv_heads, 1, -1)
    if hasattr(a, "q_norm"):  # qwen3
        q, k = a.q_norm(q), a.k_norm(k)
    v = v.reshape(B, a.n_kv_heads, 1, -1)
    q, k = a.rope(q, offset=cache.offset), a.rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    return q, k, v


class RowsAttention(nn.Module):
    """Wraps one layer's attention for plain_rows.py: a one-token step runs the subclass's
    `rows` over (B, D); anything else goes to the original module, op for op."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        return self.inner(x, mask, cache)

    def takes_rows(self, x: mx.array, mask: Any, cache: Any) -> bool:
        """A one-token step (a cache gives the offset); the mask goes to mlx-lm's call as is:
        None for one row, the batch's padding mask (B, 1, 1, L) for several."""
        return x.shape[1] == 1 and cache is not None


class HeldMLP(nn.Module):
    """Wraps a dense swiglu MLP (`dense_mlps()`): over 2-D rows (`rows`) its three projections
    take held transposes, the same formula, down(swiglu(gate(x), up(x))); anything else goes
    to the original module."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._gate, self._up, self._down = (
            held(getattr(inner, n)) for n in ("gate_proj", "up_proj", "down_proj")
        )

    def __call__(self, x: mx.array) -> mx.array:
        return self.inner(x)

    def rows(self, x: mx.array) -> mx.array:
        return self._down(swiglu(self._gate(x), self._up(x)))


class StepConstants:
    """The folded attention's broadcast constants, made once and held by every layer of a model:
    the query scale per shape (across steps) and the mask's `where` arguments per step (every
    layer of a step gets the same mask array, so the first layer's serve the rest)."""

    def __init__(self) -> None:
        self._scales: dict[tuple, mx.array] = {}  # one per row count: bounded by the batch cap
        self._mask: mx.array | None = None  # held, so compared by identity
        self._where: tuple[tuple, mx.array, mx.array] | None = None

    def scale(self, value: float, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
        key = (value, shape, dtype)
        if (s := self._scales.get(key)) is None:
            s = self._scales[key] = mx.broadcast_to(mx.array(value, dtype), shape)
        return s

    def where(self, mask: mx.array, shape: tuple[int, ...], dtype: mx.Dtype) -> tuple:
        """`mask` (B, L) as the scores' (B, kv heads, group, L) condition, and the fill."""
        if mask is not self._mask or self._where is None or self._where[0] != (shape, dtype):
            B, L = shape[0], shape[-1]
            keep = mx.broadcast_to(mask.reshape(B, 1, 1, L), shape)
            fill = mx.broadcast_to(mx.array(mx.finfo(dtype).min, dtype), shape)
            self._mask, self._where = mask, ((shape, dtype), keep, fill)
        return self._where[1], self._where[2]


class RowsStep:
    """Mixed into a copy of a pre-norm decoder block (`rows_block`): a folded one-token step of
    several rows runs as mlx-lm's block does, `x + attn(norm(x))` then `h + mlp(norm(h))`, over
    (B, D); anything else goes to the block's own call."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        attn = self.self_attn  # type: ignore[attr-defined]
        if not attn.takes_rows(x, mask, cache):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        B, _, D = x.shape
        x = x.reshape(B, D)
        h = x + attn.rows(self.input_layernorm(x), mask, cache)  # type: ignore[attr-defined]
        mlp = self.mlp  # type: ignore[attr-defined]
        out = h + _mlp_rows(mlp, self.post_attention_layernorm(h))  # type: ignore[attr-defined]
        return out.reshape(B, 1, D)


def _mlp_rows(mlp: Any, x: mx.array) -> mx.array:
    if hasattr(mlp, "rows"):  # FusedMLP, HeldMLP
        return mlp.rows(x)
    if type(mlp) in dense_mlps():  # Linear layers: any leading shape
        return mlp(x)
    return mlp(x[:, None]).squeeze(1)  # a mixture of experts keeps its 3-D call, op for op


@functools.cache  # read per layer per step (_mlp_rows): the import and tuple once
def dense_mlps() -> tuple[type, ...]:
    """MLPs whose call is down(swiglu(gate(x), up(x))), checked by class (mlx-lm's llama,
    qwen2, qwen3 and qwen3_moe dense layers)."""
    from mlx_lm.models import llama, qwen2, qwen3, qwen3_moe

    return (llama.MLP, qwen2.MLP, qwen3.MLP, qwen3_moe.MLP)


@functools.cache
def blocks() -> tuple[type, ...]:
    """The decoder blocks whose call is exactly RowsStep's formula (read in mlx-lm 0.32)."""
    from mlx_lm.models import llama, qwen2, qwen3, qwen3_moe

    return (llama.TransformerBlock, qwen2.TransformerBlock, qwen3.TransformerBlock,
            qwen3_moe.Qwen3MoeDecoderLayer)  # fmt: skip


_classes: dict[tuple[type, type], type] = {}


def rows_block(twin: Any, step: type | None = None) -> Any:
    """`twin` (a shallow copy of one of `blocks()`, or of a block the caller found to be
    `step`'s formula) with RowsStep (or `step`) mixed into its class, so it keeps every
    attribute its model reads (`self_attn`, `mlp`, llama's `use_sliding`)."""
    base = type(twin)
    if step is None and base not in blocks():
        return twin
    step = step or RowsStep
    if (cls := _classes.get((base, step))) is None:
        cls = _classes[base, step] = type(f"Rows{base.__name__}", (step, base), {})
    twin.__class__ = cls
    return twin
