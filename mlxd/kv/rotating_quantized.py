"""Quantized sliding-window KV for one row: mlx-lm's RotatingKVCache ring (keep, trim, rotate,
temporal order) over QuantizedKVCache's (packed uint32, scales, biases) storage. mlx-lm's
`RotatingKVCache.to_quantized` raises "Quantization NYI"; mlx-optiq's RotatingQuantizedKVCache
fills the gap and is the oracle: same slots, same bits (tests/kv/test_rotating_quantized.py).

Groups run along the head dimension, so each position quantizes alone: the ring holds, slot for
slot, `mx.quantize` of what mlx-lm's bf16 RotatingKVCache would hold after the same updates.
"""

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

Quant = tuple[mx.array, mx.array, mx.array]  # packed uint32, scales, biases: [B, H, S, *]


def qlen(q: Quant) -> int:
    """Slots along the token axis."""
    return q[0].shape[2]


def qmap(fn: Any, *qs: Quant) -> Quant:
    """`fn` applied to the three components alike (all ring surgery is along the token axis)."""
    return tuple(fn(*xs) for xs in zip(*qs, strict=True))  # type: ignore[return-value]


def qcat(*qs: Quant) -> Quant:
    return qmap(lambda *xs: mx.concatenate(xs, axis=2), *qs)


def qzeros(b: int, h: int, s: int, dim: int, bits: int, group: int, dtype: mx.Dtype) -> Quant:
    """Empty slots; dim * bits / 32 words is mx.quantize's packing for every bit width."""
    return (
        mx.zeros((b, h, s, dim * bits // 32), dtype=mx.uint32),
        mx.zeros((b, h, s, dim // group), dtype=dtype),
        mx.zeros((b, h, s, dim // group), dtype=dtype),
    )


def grow_ring(cache: Any, keys: mx.array, values: mx.array, prev: int) -> bool:
    """Decode into a ring still below its window: add `step` empty slots (fewer near the
    window) when the write position reached the end, as mlx-lm's ring grows. True if grown."""
    if cache.keys is not None and not (
        prev >= qlen(cache.keys) and qlen(cache.keys) < cache.max_size
    ):
        return False
    b, h, _, dk = keys.shape
    n = min(cache.step, cache.max_size - prev)
    new_k = qzeros(b, h, n, dk, cache.bits, cache.group_size, keys.dtype)
    new_v = qzeros(b, h, n, values.shape[3], cache.bits, cache.group_size, values.dtype)
    if cache.keys is None:
        cache.keys, cache.values = new_k, new_v
    else:
        cache.keys, cache.values = qcat(cache.keys, new_k), qcat(cache.values, new_v)
    return True


class QuantRing:
    """What the solo and batched quantized rings share, mixed in before mlx-lm's ring class."""

    group_size: int
    bits: int

    def _quantize(self, x: mx.array) -> Quant:
        return mx.quantize(x, group_size=self.group_size, bits=self.bits)  # type: ignore[return-value]

    # mlx-lm's ring helpers, run on each component (they only read shape[2] and the bookkeeping)
    def _trim(self, trim_size: int, v: Quant, append: Quant | None = None) -> Quant:
        extra = append if append is not None else (None, None, None)
        trim = super()._trim  # type: ignore[misc]
        return tuple(trim(trim_size, x, a) for x, a in zip(v, extra, strict=True))  # type: ignore[return-value]


class RotatingQuantizedKVCache(QuantRing, RotatingKVCache):
    """RotatingKVCache with quantized storage. The ring bookkeeping (`offset`, `_idx`, `keep`,
    `max_size`) means what it means in mlx-lm, so make_mask / size / trim are inherited."""

    step = 256

    def __init__(self, max_size: int, keep: int = 0, group_size: int = 64, bits: int = 8) -> None:
        super().__init__(max_size=max_size, keep=keep)
        self.group_size, self.bits = group_size, bits

    def _temporal_order(self, v: Quant) -> Quant:  # type: ignore[override]
        return qmap(super()._temporal_order, v)

    # prefill: the ring is unrolled into temporal order and grows to max_size + S - 1
    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[Quant, Quant]:  # type: ignore[override]
        qk, qv = self._quantize(keys), self._quantize(values)
        if self.keys is None:
            self.keys, self.values = qk, qv
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = qlen(self.keys)
            trim = self._idx - self.max_size + 1  # every new token still sees max_size tokens
            self.keys = self._trim(trim, self.keys, qk)
            self.values = self._trim(trim, self.values, qv)
        self.offset += keys.shape[2]
        self._idx = qlen(self.keys)
        return self.keys, self.values

    # decode: grow by `step` until max_size, then overwrite the oldest slot after `keep`
    def _update_in_place(self, keys: mx.array, values: mx.array) -> tuple[Quant, Quant]:  # type: ignore[override]
        b, h, s, dk = keys.shape
        prev = self.offset
        if grow_ring(self, keys, values, prev):
            self._idx = prev
        trim = qlen(self.keys) - self.max_size
        if trim > 0:  # leaving a prefill that overshot the window
            self.keys, self.values = self._trim(trim, self.keys), self._trim(trim, self.values)
            self._idx = self.max_size
        if self._idx == self.max_size:
            self._idx = self.keep
        qk, qv = self._quantize(keys), self._quantize(values)
        for i in range(3):
            self.keys[i][..., self._idx : self._idx + s, :] = qk[i]
            self.values[i][..., self._idx : self._idx + s, :] = qv[i]
        self.offset += s
        self._idx += s
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Quant, Quant]:  # type: ignore[override]
        n = self.offset
        if n < qlen(self.keys):
            return qmap(lambda x: x[..., :n, :], self.keys), qmap(
                lambda x: x[..., :n, :], self.values
            )
        return self.keys, self.values

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> "RotatingQuantizedKVCache":  # type: ignore[override]
        return self  # maybe_quantize_kv_cache asks again every step

    @classmethod
    def merge(cls, caches: list[Any]) -> Any:  # type: ignore[override]
        from .batch_rotating_quantized import BatchRotatingQuantizedKVCache

        return BatchRotatingQuantizedKVCache.merge(caches)

    # bookkeeping (mlx-lm's state tuple, plus the scheme, so from_state rebuilds it)
    @property
    def state(self) -> tuple[Any, ...]:  # type: ignore[override]
        return (self.keys, self.values, self.offset, self.keep, self.max_size, self._idx,
                self.group_size, self.bits)  # fmt: skip

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        (self.keys, self.values, self.offset, self.keep, self.max_size, self._idx,
         self.group_size, self.bits) = v  # fmt: skip

    @property
    def nbytes(self) -> int:  # type: ignore[override]
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def to_quantized_rotating(
    cache: RotatingKVCache, group_size: int = 64, bits: int = 4
) -> RotatingQuantizedKVCache:
    """A bf16 ring quantized where it stands (optiq's conversion): every slot, wrapped or not,
    in its current order, with `offset` and `_idx` kept, so the next update lands where the
    bf16 cache's would. Already-quantized caches come back as they are."""
    if isinstance(cache, RotatingQuantizedKVCache):
        return cache
    out = RotatingQuantizedKVCache(cache.max_size, cache.keep, group_size=group_size, bits=bits)
    if cache.keys is not None:
        out.keys, out.values = out._quantize(cache.keys), out._quantize(cache.values)
    out.offset, out._idx = cache.offset, cache._idx
    return out
