"""Rows leaving a batch cache by slices instead of a gather: the same values, bit for bit.

mlx-lm's `filter` keeps rows with `keys[indices]`, a gather over the whole cache, whenever a row
ends or a prefill wave moves to decoding in part. On an H200 that gather took 55-77 ms for 28-31
rows of a 0.6B model's 3.7k-token cache, and the same rows as slices of their runs 8-11 ms
(docs/performance.md). On 2 CPU cores the gather was as fast or faster, and Metal was not
measured: slices only on CUDA.
"""

from typing import Any

import mlx.core as mx


def rows_of(indices: Any) -> list[int]:
    """A filter's batch indices (a list or an mx.array) as a list."""
    return indices.tolist() if isinstance(indices, mx.array) else list(indices)


def runs(keep: list[int]) -> list[tuple[int, int]]:
    """keep's ascending runs of consecutive rows as [start, stop) pairs."""
    out: list[list[int]] = []
    for i in keep:
        if out and i == out[-1][1]:
            out[-1][1] += 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


def sliced() -> bool:
    """Whether rows leave by slices here: on an MLX-CUDA GPU (see the module doc)."""
    return mx.default_device() == mx.gpu and mx.cuda.is_available()


def take_rows(
    x: mx.array, keep: list[int], by_slices: bool | None = None, start: int = 0
) -> mx.array:
    """`x[keep][..., start:, :]` (a batch cache's rows, from column `start` of axis 2): a gather
    and a view, or (on CUDA) one copy of keep's runs, a view for one run (the next cache update
    copies it). Trimming in that copy spares the next update a copy of the whole cache."""
    if not (sliced() if by_slices is None else by_slices):
        out = x[mx.array(keep, dtype=mx.int32)]
        return out[..., start:, :] if start else out
    parts = [x[a:b, :, start:] for a, b in runs(keep)]
    if not parts:
        return x[:0, :, start:]
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
