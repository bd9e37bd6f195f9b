"""Phi-3's attention and MLP over 2-D rows, for plain_rows.py's one-token step: mlx-lm's phi3
formula (one fused qkv projection split by columns, one fused gate/up projection) with the two
projections' transposes held, the same ops on the same values, so the same bits
(tests/model/test_plain_rows.py). Its block is RowsStep's pre-norm formula."""

import functools
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import scaled_dot_product_attention

from .rows_step import RowsAttention, heads_rows, held


class PhiRowsAttention(RowsAttention):
    """Wraps one phi3 attention: a one-token step over (B, D) rows (`rows`); anything else goes
    to the original module, op for op."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__(inner)
        self._qkv, self._o = held(inner.qkv_proj), held(inner.o_proj)

    def rows(self, x: mx.array, mask: Any, cache: Any) -> mx.array:
        a = self.inner
        q_end = a.n_heads * a.head_dim
        q, k, v = mx.split(self._qkv(x), [q_end, q_end + a.n_kv_heads * a.head_dim], axis=-1)
        q, k, v = heads_rows(a, q, k, v, cache)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=a.scale, mask=mask)
        return self._o(out.reshape(x.shape[0], -1))


class PhiMLP(nn.Module):
    """Wraps a phi3 MLP: over rows, down(swiglu(gate, up)) from one held gate/up projection."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._gate_up, self._down = held(inner.gate_up_proj), held(inner.down_proj)

    def __call__(self, x: mx.array) -> mx.array:
        return self.inner(x)

    def rows(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self._gate_up(x), 2, axis=-1)
        return self._down(swiglu(gate, up))


@functools.cache
def phi_blocks() -> tuple[type, ...]:
    """The blocks whose attention and MLP are phi3's (read in mlx-lm 0.32)."""
    from mlx_lm.models import phi3

    return (phi3.TransformerBlock,)
