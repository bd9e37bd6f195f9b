"""Batched decode attention without MLX's masked fallback (opt-in: `--batched-attention folded`).

A batched decode step attends one query per row under a padding mask. MLX's fused attention
kernels take no array mask on CUDA (and the CPU has none), so `mx.fast.scaled_dot_product_attention`
falls back to plain ops that broadcast every key over the GQA group: on an H200 that is 40 ms of
a 62 ms Qwen3-8B step at 32 rows x 4k tokens, against 7.5 ms when the group is folded into the
matmul's rows (docs/performance.md). This module computes the same formula that way.

It changes no module of the caller's model: `folded(model)` returns a shallow copy whose layers'
attention modules are wrapped. Anything other than a masked one-token step of a supported
architecture goes to the original module, op for op.
"""

import copy
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..config import ATTENTION_MODES
from . import row_gemv
from .aligned_keys import AlignedMasks, aligned, key_alignment
from .fused_projections import Stacked, fused_mlp, stack_in_place, stacked_qkv
from .rows_step import Projections, StepConstants, heads_rows, rows_block

# Architectures whose attention is the standard q/k/v projection, optional q/k RMSNorm, RoPE at
# the cache offset, cache update, attention, o_proj (tests/model/test_folded_attention.py).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")
# folded+fused: also q/k/v and gate/up as one matmul each (model/fused_projections.py);
# +gemv: the step's small projections through MLX's batched gemv, not cuBLASLt (row_gemv.py).
MODES = ATTENTION_MODES


def is_folded(mode: str) -> bool:
    """Every mode but mlx wraps the model's attention modules."""
    return mode in MODES and mode != "mlx"


def is_fused(mode: str) -> bool:
    return "+fused" in mode


def is_gemv(mode: str) -> bool:
    return mode.endswith("+gemv")


def for_mode(model: nn.Module, mode: str, rows: bool = True) -> nn.Module:
    """The model a batch of this --batched-attention mode steps (`rows`: folded's)."""
    if not is_folded(mode):
        return model
    return folded(model, fuse=is_fused(mode), gemv=is_gemv(mode), rows=rows)


def unsupported(model: Any, mode: str = "folded") -> str | None:
    """Why this --batched-attention mode cannot serve this model, or None."""
    kind = getattr(getattr(model, "args", None), "model_type", None)
    if kind not in SUPPORTED:
        return f"--batched-attention {mode} supports {', '.join(SUPPORTED)}; this model is {kind!r}"
    return None


def folded(
    model: nn.Module,
    align: int | None = None,
    fuse: bool = False,
    gemv: bool = False,
    rows: bool = True,
) -> nn.Module:
    """A model sharing `model`'s weights whose batched decode attention is folded, over keys
    padded to a multiple of `align` (default: `key_alignment()`); `fuse`: its batched decode
    steps also run q/k/v and gate/up as one matmul each (those weights stacked in place);
    `gemv`: those steps' small projections run as row_gemv.py's batched gemv (with `fuse`);
    `rows`: the blocks step on 2-D rows (rows_step.py; off: the 3-D step, for probes and
    tests)."""
    align = key_alignment() if align is None else align
    if (why := unsupported(model)) is not None:
        raise ValueError(why)
    if fuse:  # before the rows step holds any of those weights (fused_projections.py)
        stack_in_place(model)
    shadow = copy.copy(model)
    inner = copy.copy(model.model)
    layers = []
    masks = AlignedMasks()  # one per model: every layer of a step gets the same mask
    constants = StepConstants()
    parts = row_gemv.parts() if gemv else frozenset()
    for layer in model.model.layers:
        twin = copy.copy(layer)
        attn = row_gemv.with_gemv(layer.self_attn, "o_proj") if "o" in parts else layer.self_attn
        twin.self_attn = FoldedAttention(attn, align, masks, constants)
        twin.self_attn.gemv_qk_rows = row_gemv.max_rows() if "qk" in parts else 0
        if fuse:
            twin.self_attn.qkv = stacked_qkv(layer.self_attn, "qkv" in parts)
            twin.mlp = fused_mlp(layer.mlp, "gate_up" in parts, "down" in parts)
        layers.append(rows_block(twin) if rows else twin)
    inner.layers = layers
    shadow.model = inner
    if "head" in parts:
        row_gemv.gemv_head(shadow, inner)
    return shadow


def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: mx.array,
    gemv: bool = False,
    held: StepConstants | None = None,
) -> mx.array:
    """MLX's fallback formula (scale, scores, mask, precise softmax, weighted sum) for one query
    per row, with each KV head's query group as the rows of one matmul instead of a broadcast.
    `gemv`: the scores as row_gemv.scores' batch of gemvs; `held`: the broadcast constants
    from there (the same values, no Broadcast nodes)."""
    B, n_heads, _, D = q.shape
    n_kv, L = k.shape[1], k.shape[2]
    s = mx.array(scale, q.dtype) if held is None else held.scale(scale, q.shape, q.dtype)
    q = (q * s).reshape(B, n_kv, n_heads // n_kv, D)
    scores = row_gemv.scores(q, k) if gemv else q @ k.swapaxes(-1, -2)
    if held is not None and mask.dtype == mx.bool_:
        keep, fill = held.where(mask, scores.shape, scores.dtype)
        scores = mx.where(keep, scores, fill)
    elif mask.dtype == mx.bool_:
        mask = mask.reshape(B, 1, 1, L)
        scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    else:
        scores = scores + mask.reshape(B, 1, 1, L)
    scores = mx.softmax(scores, axis=-1, precise=True)
    return (scores @ v).reshape(B, n_heads, 1, D)


def _foldable(x: mx.array, mask: Any, cache: Any) -> bool:
    """A one-token step of several rows under an array mask with one entry per row and key."""
    if x.shape[1] != 1 or x.shape[0] < 2 or not isinstance(mask, mx.array) or cache is None:
        return False
    if hasattr(cache, "bits"):  # quantized KV: mlx-lm's quantized attention
        return False
    return mask.size == x.shape[0] * mask.shape[-1]


class FoldedAttention(nn.Module):
    """Wraps one layer's attention: the same projections, norms and RoPE, folded attention."""

    def __init__(
        self,
        inner: nn.Module,
        align: int = 1,
        masks: Any = None,
        constants: StepConstants | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.align = align
        self.masks = masks if masks is not None else AlignedMasks()
        self.constants = constants if constants is not None else StepConstants()
        self.proj = Projections(inner)  # for the rows step (rows_step.py)
        self.qkv: Stacked | None = None  # set by folded(fuse=True) where the layers stack
        self.gemv_qk_rows = 0  # scores as gemvs up to this many rows (folded(gemv=True), qk)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if not _foldable(x, mask, cache):
            return self.inner(x, mask, cache)
        a = self.inner
        B, L, _ = x.shape
        q, k, v = self.qkv(x) if self.qkv is not None else (a.q_proj(x), a.k_proj(x), a.v_proj(x))
        q, k = q.reshape(B, L, a.n_heads, -1), k.reshape(B, L, a.n_kv_heads, -1)
        if hasattr(a, "q_norm"):  # qwen3
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = a.rope(q, offset=cache.offset), a.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        if self.align > 1:
            k, v, mask = aligned(self.align, cache, k, v, mask, self.masks)
        out = attention(q, k, v, a.scale, mask, B <= self.gemv_qk_rows)
        return a.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def takes_rows(self, x: mx.array, mask: Any, cache: Any) -> bool:
        """Whether its block steps on 2-D rows (rows_step.py): a folded step."""
        return _foldable(x, mask, cache)

    def rows(self, x: mx.array, mask: mx.array, cache: Any) -> mx.array:
        """The folded step over (B, D) rows: the heads reshaped straight to (B, H, 1, D), the
        weights' transposes and the attention's constants held (rows_step.py)."""
        a, p = self.inner, self.proj
        B = x.shape[0]
        qkv = self.qkv(x) if self.qkv is not None else (p.q(x), p.k(x), p.v(x))
        q, k, v = heads_rows(a, *qkv, cache)
        if self.align > 1:
            k, v, mask = aligned(self.align, cache, k, v, mask, self.masks)
        out = attention(q, k, v, a.scale, mask, B <= self.gemv_qk_rows, self.constants)
        return p.o(out.reshape(B, -1))
