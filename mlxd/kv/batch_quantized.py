"""Quantized KV for rows in a batch: mlx-lm's QuantizedKVCache layout (packed values, scales,
biases per group) with BatchKVCache's left-padded rows and its merge / extend / filter /
extract protocol. mlx-lm has no batched form: its server runs `--kv-bits` one row at a time.

Rows are only ever moved, never re-quantized, so a row's (packed, scales, biases) bytes after
any of these operations equal its solo cache's. New tokens are quantized per position (groups
run along the head dimension), so they also equal the solo quantization of the same values.
"""

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    QuantizedKVCache,
    _BaseCache,
    create_causal_mask,
)

from .batch_roll import roll_rows, rolling
from .take_rows import rows_of, take_rows

Quant = tuple[mx.array, mx.array, mx.array]  # packed uint32, scales, biases: [B, H, S, *]


def _map(fn: Callable[[mx.array], mx.array], q: Quant) -> Quant:
    return tuple(fn(x) for x in q)  # type: ignore[return-value]


def _cat(a: Quant, b: Quant, axis: int) -> Quant:
    return tuple(mx.concatenate([x, y], axis=axis) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _zeros(b: int, h: int, s: int, dim: int, bits: int, group: int, dtype: mx.Dtype) -> Quant:
    per_int = 32 // bits
    return (
        mx.zeros((b, h, s, dim // per_int), dtype=mx.uint32),
        mx.zeros((b, h, s, dim // group), dtype=dtype),
        mx.zeros((b, h, s, dim // group), dtype=dtype),
    )


class BatchQuantizedKVCache(_BaseCache):
    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        self.keys: Quant | None = None
        self.values: Quant | None = None
        self.group_size, self.bits = group_size, bits
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])  # per row: tokens of its own
        self._idx = 0  # columns in use (the longest row, padding included)
        self._right_padding: mx.array | None = None

    # the step
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Quant, Quant]:
        b, h, n, dk = keys.shape
        prev = self._idx
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            grow = (self.step + n - 1) // self.step * self.step
            new_k = _zeros(b, h, grow, dk, self.bits, self.group_size, keys.dtype)
            new_v = _zeros(b, h, grow, values.shape[3], self.bits, self.group_size, keys.dtype)
            if self.keys is None or self.values is None:
                self.keys, self.values = new_k, new_v
            else:
                old_k = _map(lambda x: x[..., :prev, :], self.keys)
                old_v = _map(lambda x: x[..., :prev, :], self.values)
                self.keys, self.values = _cat(old_k, new_k, 2), _cat(old_v, new_v, 2)
        self.offset = self.offset + n
        self._idx += n
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        assert self.keys is not None and self.values is not None
        for i in range(3):
            self.keys[i][..., prev : self._idx, :] = qk[i]
            self.values[i][..., prev : self._idx, :] = qv[i]
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Quant, Quant]:
        assert self.keys is not None and self.values is not None
        idx = self._idx
        return _map(lambda x: x[..., :idx, :], self.keys), _map(
            lambda x: x[..., :idx, :], self.values
        )

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # prefill with right padding (BatchGenerator's prompt batches), as BatchKVCache
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty cache")
            pad = mx.array(left_padding)
            self.left_padding += pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        if self._right_padding is not None and self.keys is not None and self.values is not None:
            pad = self._right_padding
            shifts = pad.tolist()
            roll = lambda x: roll_rows(x, shifts)  # noqa: E731
            self.keys, self.values = _map(roll, self.keys), _map(roll, self.values)
            self.offset = self.offset - pad
            self.left_padding += pad
            self._right_padding = None

    # rows joining and leaving
    def filter(self, batch_indices: Any) -> None:
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        # every row has padding on the left: drop the shared part in the same take
        shift = min(self.left_padding.tolist()) if self.left_padding.size else 0
        if self.keys is not None and self.values is not None:
            keep = rows_of(batch_indices)
            self.keys = _map(lambda x: take_rows(x, keep, start=shift), self.keys)
            self.values = _map(lambda x: take_rows(x, keep, start=shift), self.values)
        if shift > 0:
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other: "BatchQuantizedKVCache") -> None:
        """Append `other`'s rows; both are right-aligned at the longer one's column."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        ref = self if self.keys is not None else other
        parts = [c._aligned(idx, ref) for c in (self, other)]
        self.keys = _cat(parts[0][0], parts[1][0], 0)
        self.values = _cat(parts[0][1], parts[1][1], 0)
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([c.left_padding + (idx - c._idx) for c in (self, other)])
        self._idx = idx

    def _aligned(self, idx: int, ref: "BatchQuantizedKVCache") -> tuple[Quant, Quant]:
        """This cache's used columns, left-padded to end at column `idx` (all padding when it
        is still empty: shapes from `ref`)."""
        if self.keys is None or self.values is None:
            b = self.offset.shape[0]
            empty = lambda q: _map(lambda x: mx.zeros((b, x.shape[1], 0, x.shape[3]), x.dtype), q)  # noqa: E731
            k, v = empty(ref.keys), empty(ref.values)
        else:
            k, v = self.keys_and_values()
        pad = [(0, 0), (0, 0), (idx - self._idx, 0), (0, 0)]
        return _map(lambda x: mx.pad(x, pad), k), _map(lambda x: mx.pad(x, pad), v)

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row `idx` as a solo QuantizedKVCache, its padding dropped."""
        assert self.keys is not None and self.values is not None
        pad = self.left_padding.tolist()[idx]
        cut = lambda x: mx.contiguous(x[idx : idx + 1, :, pad : self._idx])  # noqa: E731
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        cache.keys, cache.values = _map(cut, self.keys), _map(cut, self.values)
        cache.offset = self._idx - pad
        return cache

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> "BatchQuantizedKVCache":
        """Solo quantized caches as one left-padded batch (all with one group size and bits)."""
        schemes = {(c.group_size, c.bits) for c in caches}
        if len(schemes) != 1:
            raise ValueError(f"rows with different KV schemes cannot share a batch: {schemes}")
        group, bits = schemes.pop()
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        out = cls([longest - n for n in lengths], group_size=group, bits=bits)
        if longest == 0:
            return out
        ref = next(c for c in caches if c.keys is not None)
        h, dtype = ref.keys[0].shape[1], ref.keys[1].dtype
        dk = ref.keys[0].shape[3] * 32 // bits
        dv = ref.values[0].shape[3] * 32 // bits
        out.keys = _zeros(len(caches), h, longest, dk, bits, group, dtype)
        out.values = _zeros(len(caches), h, longest, dv, bits, group, dtype)
        for row, (n, c) in enumerate(zip(lengths, caches, strict=True)):
            if n == 0:
                continue
            for i in range(3):
                out.keys[i][row : row + 1, :, longest - n :] = c.keys[i][..., :n, :]
                out.values[i][row : row + 1, :, longest - n :] = c.values[i][..., :n, :]
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @classmethod
    def from_batch(cls, cache: BatchKVCache, group_size: int, bits: int) -> "BatchQuantizedKVCache":
        """A bf16 batch cache quantized in place of it (maybe_quantize_kv_cache's step, batched):
        each position's groups quantize alone, so rows equal their solo `to_quantized`."""
        out = cls([0], group_size=group_size, bits=bits)
        out.left_padding, out.offset, out._idx = cache.left_padding, cache.offset, cache._idx
        if cache.keys is not None:
            k, v = cache.keys_and_values()
            out.keys = mx.quantize(k, group_size=group_size, bits=bits)
            out.values = mx.quantize(v, group_size=group_size, bits=bits)
        return out

    # bookkeeping
    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


class RowQuantizedKVCache(QuantizedKVCache):
    """mlx-lm's QuantizedKVCache that BatchGenerator can merge (mlx-lm's has no `merge`)."""

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> BatchQuantizedKVCache:  # type: ignore[override]
        return BatchQuantizedKVCache.merge(caches)


def mergeable(cache: list[Any], additive_mask: bool = False) -> list[Any]:
    """A row's cache list with its QuantizedKVCache layers as RowQuantizedKVCache (so mlx-lm's
    `_merge_caches` can batch them) and its KVCache layers as RowKVCache (kv/batch_roll.py,
    with `additive_mask`), holding the same arrays, not copies."""
    out = []
    for c in cache:
        if type(c) is QuantizedKVCache:
            row = RowQuantizedKVCache(group_size=c.group_size, bits=c.bits)
            row.keys, row.values, row.offset = c.keys, c.values, c.offset
            c = row
        out.append(rolling(c, additive_mask))
    return out


def is_quantized(cache: list[Any] | None) -> bool:
    return cache is not None and any(hasattr(c, "bits") for c in cache)


def batch_format(cache: list[Any] | None) -> tuple[tuple[int, int, int], ...] | None:
    """Which batch a row's cache can join: None while unquantized, else (layer, bits, group)
    of every quantized layer (rows share a batch only when every layer has one format)."""
    if not is_quantized(cache):
        return None
    assert cache is not None
    return tuple((i, c.bits, c.group_size) for i, c in enumerate(cache) if hasattr(c, "bits"))
