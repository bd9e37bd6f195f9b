"""mlx-lm's BatchKVCache with a faster `finalize`: the same arrays, bit for bit.

After a right-padded prefill, `finalize` rolls every row so its padding moves to the left.
mlx-lm rolls with `take_along_axis` over the whole cache; on MLX-CUDA that gather moved ~30 GB/s
on an H200 (128 ms of a 0.6B model's 8-row join, docs/performance.md). Each row's shift is
known on the host, so here a row is rolled as two slices: plain copies, the same values.
"""

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


def roll_rows(x: mx.array, shifts: list[int]) -> mx.array:
    """`np.roll` of row i by shifts[i] along axis 2 (mlx-lm's `dynamic_roll`, by slices)."""
    n = x.shape[2]
    if not any(s % n for s in shifts):
        return x
    rows = []
    for i, s in enumerate(shifts):
        row, s = x[i : i + 1], s % n
        rows.append(mx.concatenate([row[:, :, n - s :], row[:, :, : n - s]], axis=2) if s else row)
    return mx.concatenate(rows, axis=0)


class RollingBatchKVCache(BatchKVCache):
    """A BatchKVCache whose `finalize` rolls rows by slicing (see module doc)."""

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchKVCache:
        out = super().merge(caches)
        if type(out) is BatchKVCache:  # mlx-lm builds the all-empty merge as its own class
            out = cls([0] * len(caches))
        return out

    def filter(self, batch_indices: Any) -> None:
        """mlx-lm's filter; keeping every row in order gathers nothing. mlx-lm copies the whole
        cache then (`keys[indices]`), e.g. when a prefill wave moves to decoding."""
        keep = batch_indices.tolist() if isinstance(batch_indices, mx.array) else batch_indices
        if self.keys is None or list(keep) != list(range(self.keys.shape[0])):
            return super().filter(batch_indices)
        shift = min(self.left_padding.tolist())  # mlx-lm's trim of the common left padding
        if shift > 0:
            self.keys = self.keys[..., shift:, :]
            self.values = self.values[..., shift:, :]
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

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchKVCache:
        return RollingBatchKVCache.merge(caches)


def rolling(cache: Any) -> Any:
    """A plain KVCache layer as a RowKVCache holding the same arrays; any other layer as is."""
    if type(cache) is not KVCache:
        return cache
    row = RowKVCache()
    row.keys, row.values, row.offset = cache.keys, cache.values, cache.offset
    return row
