"""One RoPE offset add per batched step instead of one per layer (every batch mode).

mlx-lm's BatchKVCache.update_and_fetch advances each layer's `offset` array with its own add,
left lazy until the next step's RoPE reads it, so a 28-layer step launches 28 adds of equal
values (`probe_ops --neighbours Add` on the H200), each an op MLX encodes on the
host. After a step, every layer that advanced takes a copy of the first one's array: the same
graph node, computed once by the next step (a copy, so an in-place op on one layer's offset, as
mlx-lm's caches make, leaves the others alone). A batch's layers hold the same rows' histories,
so their offsets are equal and the bits unchanged.
"""

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from .batch_roll import RollingBatchKVCache

# Full-attention batch layers (not rotating, not quantized): one offset counts each row's tokens.
PLAIN = (BatchKVCache, RollingBatchKVCache)


def offsets(caches: list[Any]) -> list[Any]:
    """Each layer's offset object before a step, for `share` to see which layers advanced."""
    return [getattr(c, "offset", None) for c in caches]


def share(caches: list[Any], before: list[Any]) -> int:
    """After a step: each plain batch layer whose offset advanced (a new array) takes a copy of
    the first such layer's. Returns how many layers did."""
    first, shared = None, 0
    for cache, was in zip(caches, before, strict=True):
        now = getattr(cache, "offset", None)
        if type(cache) not in PLAIN or now is was or not isinstance(now, mx.array):
            continue
        if first is None:
            first = now
        elif now.shape == first.shape:
            cache.offset = copy.copy(first)
            shared += 1
    return shared
