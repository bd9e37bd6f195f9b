"""Folded attention's key count rounded up to a multiple of 8 on CUDA, read from the cache's
buffer with the extra positions masked out (tests/model/test_folded_attention.py)."""

from typing import Any

import mlx.core as mx


def key_alignment() -> int:
    """Keys per row are rounded up to a multiple of this on CUDA. cuBLAS leaves its tensor-core
    kernels for an odd leading dimension: 31 ms against 7.4 ms for an 8B step's attention at
    32 rows x 4,097 keys on an H200 (docs/performance.md). The CPU keeps MLX's bits: 1."""
    return 8 if mx.cuda.is_available() else 1


class AlignedMasks:
    """The step's mask padded to the aligned key count, built once per step: the model hands
    every layer the same mask array, so the first layer's padding serves the rest."""

    def __init__(self) -> None:
        self._of: mx.array | None = None  # held, so compared by identity
        self._n = 0
        self._padded: mx.array | None = None
        self.built = 0  # padded masks built (tests: one per step, not one per layer)

    def padded(self, mask: mx.array, n: int) -> mx.array:
        if mask is not self._of or n != self._n:
            pad = mx.zeros((*mask.shape[:-1], n - mask.shape[-1]), mx.bool_)
            self._of, self._n = mask, n
            self._padded = mx.concatenate([mask, pad], axis=-1)
            self.built += 1
        return self._padded  # type: ignore[return-value]


def aligned(align: int, cache: Any, k: mx.array, v: mx.array, mask: mx.array, masks: Any):
    """Keys and values up to the next multiple of `align` from the cache's buffer, the extra
    positions masked out (their weights are exactly 0, whatever the buffer holds there)."""
    L = k.shape[2]
    n = -(-L // align) * align
    buf = getattr(cache, "keys", None)
    if n == L or not isinstance(buf, mx.array) or buf.shape[2] < n or mask.dtype != mx.bool_:
        return k, v, mask
    return buf[..., :n, :], cache.values[..., :n, :], masks.padded(mask, n)
