"""Quantized sliding-window KV for rows in a batch: mlx-lm's BatchRotatingKVCache (left-padded
rows sharing one ring, `rotated`, per-row `offset` / `left_padding`, right-padded prefill rolled
away by `finalize`) over (packed uint32, scales, biases) storage. Neither mlx-lm nor mlx-optiq
has one: mlx-lm's raises "Quantization NYI" and optiq leaves sliding layers unquantized.

Every operation is mlx-lm's, moving slots along the token axis of the three components alike;
new tokens are quantized per position. So the batch holds, slot for slot, `mx.quantize` of what
mlx-lm's bf16 batch would hold, and a row's bytes are its solo RotatingQuantizedKVCache's.
"""

from functools import partial
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchRotatingKVCache, dynamic_roll

from .rotating_quantized import (
    Quant,
    QuantRing,
    RotatingQuantizedKVCache,
    grow_ring,
    qlen,
    qmap,
    qzeros,
)
from .take_rows import rows_of, take_rows


class BatchRotatingQuantizedKVCache(QuantRing, BatchRotatingKVCache):
    """BatchRotatingKVCache with quantized storage; make_mask, prepare, trim and size are
    inherited, since the bookkeeping is the same."""

    step = 256

    def __init__(
        self, max_size: int, left_padding: list[int], group_size: int = 64, bits: int = 8
    ) -> None:
        super().__init__(max_size, left_padding)
        self.group_size, self.bits = group_size, bits

    def _temporal_order(self) -> None:
        if self.rotated:
            roll = lambda x: mx.roll(x, -self._idx, axis=2)  # noqa: E731
            self.keys, self.values = qmap(roll, self.keys), qmap(roll, self.values)
            self._idx = qlen(self.keys)
            self.rotated = False

    def _roll_rows(self, shift: mx.array) -> None:
        roll = lambda x: dynamic_roll(x, shift[:, None], axis=2)  # noqa: E731
        self.keys, self.values = qmap(roll, self.keys), qmap(roll, self.values)

    def _bind(self) -> None:
        # as mlx-lm: evaluating the keys evaluates the bookkeeping the next mask reads
        k = mx.depends(self.keys[0], (self.left_padding, self.offset))
        self.keys = (k, *self.keys[1:])  # type: ignore[assignment]

    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[Quant, Quant]:  # type: ignore[override]
        qk, qv = self._quantize(keys), self._quantize(values)
        if self.keys is None:
            self.keys, self.values = qk, qv
        else:
            self._temporal_order()
            if qlen(self.keys) > self._idx:
                cut = lambda x: x[..., : self._idx, :]  # noqa: E731
                self.keys, self.values = qmap(cut, self.keys), qmap(cut, self.values)
            if self._lengths is not None:  # right-padded rows: padding must not evict tokens
                roll = mx.maximum(0, self.offset - self._lengths)
                self._roll_rows(roll)
                self.left_padding += roll
                self.offset = self.offset - roll
            trim = self._idx - self.max_size + 1
            if trim > 0:
                self.left_padding -= trim
            self.keys = self._trim(trim, self.keys, qk)
            self.values = self._trim(trim, self.values, qv)
        self.offset = self.offset + keys.shape[2]
        self._offset += keys.shape[2]
        self._idx = qlen(self.keys)
        self._bind()
        return self.keys, self.values

    def _update_in_place(self, keys: mx.array, values: mx.array) -> tuple[Quant, Quant]:  # type: ignore[override]
        if self._lengths is not None:
            raise RuntimeError("finalize() must be called before decoding with a rotating batch")
        b, h, s, dk = keys.shape
        prev = self._offset
        if grow_ring(self, keys, values, prev):
            self._idx = prev
        trim = qlen(self.keys) - self.max_size
        if trim > 0:
            self.keys, self.values = self._trim(trim, self.keys), self._trim(trim, self.values)
            self._idx = self.max_size
            self.left_padding -= trim
        if self._idx == self.max_size:
            self.rotated = True
            self._idx = 0
        if self.rotated:
            self.left_padding -= s
        qk, qv = self._quantize(keys), self._quantize(values)
        for i in range(3):
            self.keys[i][..., self._idx : self._idx + s, :] = qk[i]
            self.values[i][..., self._idx : self._idx + s, :] = qv[i]
        self._offset += s
        self.offset = self.offset + s
        self._idx += s
        self._bind()
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Quant, Quant]:  # type: ignore[override]
        n = self._offset
        if n < qlen(self.keys):
            return qmap(lambda x: x[..., :n, :], self.keys), qmap(
                lambda x: x[..., :n, :], self.values
            )
        return self.keys, self.values

    def finalize(self) -> None:
        if self._lengths is not None:
            roll = mx.maximum(0, self.offset - self._lengths)
            self._roll_rows(roll)
            self.left_padding += roll
            self.offset = self.offset - roll
            self._lengths = None

    # rows joining and leaving
    def filter(self, batch_indices: Any) -> None:
        if self.keys is not None:
            pick = partial(take_rows, keep=rows_of(batch_indices))
            self.keys, self.values = qmap(pick, self.keys), qmap(pick, self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]

    def extend(self, other: "BatchRotatingQuantizedKVCache") -> None:  # type: ignore[override]
        """Append `other`'s rows (as mlx-lm: both unrolled when their rings differ in phase,
        then right-aligned at the larger `_idx`)."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        if self.rotated != other.rotated or self._idx != other._idx:
            self._temporal_order()
            other._temporal_order()
        idx = max(self._idx, other._idx)
        size = max(qlen(c.keys) for c in (self, other) if c.keys is not None)
        ref = self if self.keys is not None else other
        parts = [c._aligned(idx, size, ref) for c in (self, other)]
        self.keys = _rows(parts[0][0], parts[1][0])
        self.values = _rows(parts[0][1], parts[1][1])
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([c.left_padding + (idx - c._idx) for c in (self, other)])
        self._idx = idx
        self._offset = max(self._offset, other._offset)

    def _aligned(
        self, idx: int, size: int, ref: "BatchRotatingQuantizedKVCache"
    ) -> tuple[Quant, Quant]:
        """The ring padded to `size` slots with its `_idx` moved to `idx` (shapes from `ref`
        while empty)."""
        if self.keys is None or self.values is None:
            b = self.offset.shape[0]
            empty = lambda q: qmap(lambda x: mx.zeros((b, x.shape[1], 0, x.shape[3]), x.dtype), q)  # noqa: E731
            k, v = empty(ref.keys), empty(ref.values)
        else:
            k, v = self.keys, self.values
        left = idx - self._idx
        right = size - qlen(k) - left
        if right < 0:
            k, v = qmap(lambda x: x[..., :right, :], k), qmap(lambda x: x[..., :right, :], v)
            right = 0
        pad = [(0, 0), (0, 0), (left, right), (0, 0)]
        return qmap(lambda x: mx.pad(x, pad), k), qmap(lambda x: mx.pad(x, pad), v)

    def extract(self, idx: int) -> RotatingQuantizedKVCache:  # type: ignore[override]
        """Row `idx` as a solo ring in temporal order, its padding dropped."""
        assert self.keys is not None and self.values is not None
        mx.eval(self.left_padding, self.offset)
        pad = max(0, self.left_padding.tolist()[idx])
        row = lambda x: x[idx : idx + 1]  # noqa: E731
        k, v, end = qmap(row, self.keys), qmap(row, self.values), self._idx
        if self.rotated:
            unroll = lambda x: mx.roll(x, -self._idx, axis=2)  # noqa: E731
            k, v, end = qmap(unroll, k), qmap(unroll, v), self.max_size
        cut = lambda x: mx.contiguous(x[:, :, pad:end])  # noqa: E731
        out = RotatingQuantizedKVCache(self.max_size, group_size=self.group_size, bits=self.bits)
        out.keys, out.values = qmap(cut, k), qmap(cut, v)
        out.offset = self.offset.tolist()[idx]
        out._idx = qlen(out.keys)
        return out

    @classmethod
    def merge(cls, caches: list[RotatingQuantizedKVCache]) -> "BatchRotatingQuantizedKVCache":  # type: ignore[override]
        """Solo rings as one batch: each row's last size() tokens in temporal order,
        right-aligned (all rows with one window, group size and bits)."""
        schemes = {(c.max_size, c.group_size, c.bits) for c in caches}
        if len(schemes) != 1:
            raise ValueError(f"rows with different KV schemes cannot share a batch: {schemes}")
        max_size, group, bits = schemes.pop()
        lengths = [c.size() for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls(max_size, [0] * len(caches), group_size=group, bits=bits)
        ref = next(c for c in caches if c.keys is not None)
        dtype, h = ref.keys[1].dtype, ref.keys[0].shape[1]
        dk, dv = (q[0].shape[3] * 32 // bits for q in (ref.keys, ref.values))
        keys = qzeros(len(caches), h, longest, dk, bits, group, dtype)
        values = qzeros(len(caches), h, longest, dv, bits, group, dtype)
        for i, (n, c) in enumerate(zip(lengths, caches, strict=True)):
            if c.keys is None or n == 0:  # a trimmed-to-empty ring still holds its buffer
                continue
            ck, cv = c._temporal_order(c.keys), c._temporal_order(c.values)
            for j in range(3):
                keys[j][i : i + 1, :, longest - n :] = ck[j][..., -n:, :]
                values[j][i : i + 1, :, longest - n :] = cv[j][..., -n:, :]
        out = cls(max_size, [longest - n for n in lengths], group_size=group, bits=bits)
        out.keys, out.values = keys, values
        out.offset = mx.array([c.offset for c in caches])
        out._idx = out._offset = longest
        return out

    @classmethod
    def from_batch(
        cls, cache: BatchRotatingKVCache, group_size: int, bits: int
    ) -> "BatchRotatingQuantizedKVCache":
        """A bf16 rotating batch quantized where it stands (every slot, the ring's phase and
        bookkeeping kept): each row equals its solo `to_quantized_rotating`."""
        out = cls(cache.max_size, [0], group_size=group_size, bits=bits)
        out.left_padding, out.offset = mx.array(cache.left_padding), mx.array(cache.offset)
        out._idx, out._offset, out.rotated = cache._idx, cache._offset, cache.rotated
        out._lengths = cache._lengths
        if cache.keys is not None:
            out.keys, out.values = out._quantize(cache.keys), out._quantize(cache.values)
        return out

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> "BatchRotatingQuantizedKVCache":  # type: ignore[override]
        return self

    @property
    def state(self) -> tuple[Any, ...]:  # type: ignore[override]
        return (self.keys, self.values, self.offset, self.left_padding, self.max_size,
                self._offset, self._idx, self.rotated, self.group_size, self.bits)  # fmt: skip

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        (self.keys, self.values, self.offset, self.left_padding, self.max_size,
         self._offset, self._idx, self.rotated, self.group_size, self.bits) = v  # fmt: skip
        self._lengths = None

    @property
    def nbytes(self) -> int:  # type: ignore[override]
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def _rows(a: Quant, b: Quant) -> Quant:
    return qmap(lambda x, y: mx.concatenate([x, y]), a, b)
