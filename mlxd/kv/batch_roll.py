"""mlx-lm's BatchKVCache with a faster `finalize`: the same arrays, bit for bit.

After a right-padded prefill, `finalize` rolls every row so its padding moves to the left.
mlx-lm rolls with `take_along_axis` over the whole cache; on MLX-CUDA that gather moved ~30 GB/s
on an H200 (128 ms of a 0.6B model's 8-row join, docs/performance.md). Each row's shift is
known on the host, so here a row is rolled as two slices: plain copies, the same values.
Rows leaving the batch (`filter`) are taken by slices on CUDA too (`kv/take_rows.py`). A
prefill's padding mask goes to MLX-CUDA's cuDNN attention already additive (kv/additive_mask.py).
"""

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from . import roll_kernel
from .additive_mask import additive, fused_prefill
from .take_rows import rows_of, take_rows


def roll_rows(x: mx.array, shifts: list[int]) -> mx.array:
    """`np.roll` of row i by shifts[i] along axis 2 (mlx-lm's `dynamic_roll`): one kernel on
    MLX-CUDA (roll_kernel.py), by slices elsewhere."""
    n = x.shape[2]
    if not any(s % n for s in shifts):
        return x
    if roll_kernel.available(x):
        return roll_kernel.roll(x, shifts)
    rows = []
    for i, s in enumerate(shifts):
        row, s = x[i : i + 1], s % n
        rows.append(mx.concatenate([row[:, :, n - s :], row[:, :, : n - s]], axis=2) if s else row)
    return mx.concatenate(rows, axis=0)


class RollingBatchKVCache(BatchKVCache):
    """A BatchKVCache whose `finalize` rolls rows by slicing (see module doc)."""

    additive_mask = False  # the model takes an additive prefill mask (additive_mask.py)

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchKVCache:
        out = super().merge(caches)
        if type(out) is BatchKVCache:  # mlx-lm builds the all-empty merge as its own class
            out = cls([0] * len(caches))
        out.additive_mask = all(getattr(c, "additive_mask", False) for c in caches)
        return out

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        """mlx-lm's mask; for a prefill that MLX-CUDA runs through cuDNN, in the additive form
        MLX would convert it to (additive_mask.py), so MLX broadcasts it instead of copying."""
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        if N < 2 or not self.additive_mask or self.keys is None or self.values is None:
            return mask
        if not isinstance(mask, mx.array) or mask.dtype != mx.bool_:
            return mask
        dtype = self.keys.dtype
        if not fused_prefill(dtype, self.keys.shape[-1], self.values.shape[-1]):
            return mask
        return additive(mask, dtype)

    def filter(self, batch_indices: Any) -> None:
        """mlx-lm's filter with the kept rows taken by `take_rows` (slices on CUDA); keeping
        every row in order takes nothing (mlx-lm copies the whole cache then)."""
        keep = rows_of(batch_indices)
        if self.keys is None:
            return super().filter(batch_indices)
        every = keep == list(range(self.keys.shape[0]))
        if not every:
            idx = mx.array(keep, dtype=mx.int32)
            self.offset = self.offset[idx]
            self.left_padding = self.left_padding[idx]
        shift = min(self.left_padding.tolist(), default=0)  # mlx-lm trims the shared left pad
        if every and shift > 0:
            self.keys = self.keys[..., shift:, :]
            self.values = self.values[..., shift:, :]
        elif not every:  # the rows and the trim in one take
            self.keys = take_rows(self.keys, keep, start=shift)
            self.values = take_rows(self.values, keep, start=shift)
        if shift > 0:
            self._idx -= shift
            self.left_padding -= shift

    def finalize(self) -> None:
        if self._right_padding is None:
            return
        padding = self._right_padding
        shifts = padding.tolist()
        self.keys = roll_rows(self.keys, shifts)
        self.values = roll_rows(self.values, shifts)
        self.offset = self.offset - padding
        self.left_padding += padding
        self._right_padding = None


class RowKVCache(KVCache):
    """A row's KVCache whose batch is a RollingBatchKVCache."""

    additive_mask = False  # handed to the batch it merges into

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchKVCache:
        return RollingBatchKVCache.merge(caches)


def rolling(cache: Any, additive_mask: bool = False) -> Any:
    """A plain KVCache layer as a RowKVCache holding the same arrays (its batch's prefill mask
    additive where `additive_mask` and MLX-CUDA allow); any other layer as is."""
    if type(cache) is not KVCache:
        return cache
    row = RowKVCache()
    row.keys, row.values, row.offset = cache.keys, cache.values, cache.offset
    row.additive_mask = additive_mask
    return row
