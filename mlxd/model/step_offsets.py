"""One RoPE offset add per batched decode step instead of one per layer (the folded modes).

mlx-lm's BatchKVCache.update_and_fetch advances each layer's `offset` array with its own add,
so a 28-layer step launches 28 adds of equal values (`probe_ops --neighbours Add` on the H200,
session 27), each an op MLX-CUDA encodes on the host. The step's first layer's sum serves the
rest: every later layer of the step gets a copy of that array, the same graph node (a copy, so
an in-place op on one layer's offset leaves the others alone). The values are the same, so the
bits are too.
"""

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache


class StepOffsets:
    """Per folded model. Layers run in order, so a layer at or before the one that last set the
    step's offset starts a new step; a later layer called with the same mask array (one
    attention kind) takes that offset."""

    def __init__(self) -> None:
        self._layer = -1  # the layer whose advanced offset the step's later layers take
        self._mask: Any = None  # held, so compared by identity
        self._offset: mx.array | None = None
        self.shared = 0  # layers given the step's offset (tests)

    def advanced(self, layer: int, mask: Any, cache: Any) -> None:
        """After `cache.update_and_fetch` in layer `layer`, called with `mask`."""
        offset = getattr(cache, "offset", None)
        if not isinstance(cache, BatchKVCache) or not isinstance(offset, mx.array):
            return  # rotating, quantized or single-row caches keep their own bookkeeping
        later = layer > self._layer and mask is self._mask
        if later and self._offset is not None and self._offset.shape == offset.shape:
            cache.offset = copy.copy(self._offset)
            self.shared += 1
            return
        self._layer, self._mask, self._offset = layer, mask, offset
