"""Which positions of a cache layer hold tokens, so the SSD tier writes only those: a KV layer
preallocates its buffer in steps of 256 positions, so a 309-token prefix held 512 positions.

`shrink` gives a layer whose keys and values end at the used length, plus the buffer's capacity;
`regrow` pads a restored layer back to that capacity with zeros. The restored layer then has the
original's shapes and strides (a GPU step's bits can depend on a buffer's stride, not only on
the values read) and its used positions bit for bit; positions past them are never read.
"""

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

# A capacity is an int (a layer with keys and values), None (stored whole) or, for a CacheList,
# a list of its inner layers' capacities.
Capacity = int | None | list[Any]
_MAX_CAPACITY = 1 << 31  # positions; a header asking for more is corrupt


def _length(kv: Any) -> int:
    """Positions along the token axis of keys or values (an array, or a quantized tuple)."""
    return (kv[0] if isinstance(kv, tuple | list) else kv).shape[2]


def _cut(kv: Any, n: int) -> Any:
    if isinstance(kv, tuple | list):
        return type(kv)(x[..., :n, :] for x in kv)
    return kv[..., :n, :]


def _pad(kv: Any, capacity: int) -> Any:
    """`kv` followed by zeros up to `capacity` positions: one new row-major buffer, the layout
    mlx-lm's zeros-then-concatenate growth gives."""
    if isinstance(kv, tuple | list):
        return type(kv)(_pad(x, capacity) for x in kv)
    shape = list(kv.shape)
    shape[2] = capacity - shape[2]
    return mx.concatenate([kv, mx.zeros(shape, dtype=kv.dtype)], axis=2)


def used(layer: Any) -> int | None:
    """Leading positions of the layer's buffer that hold tokens; None when it has no token
    buffer this module knows (such layers are stored whole)."""
    keys = getattr(layer, "keys", None)
    offset = getattr(layer, "offset", None)
    if keys is None or getattr(layer, "values", None) is None or not isinstance(offset, int):
        return None
    if isinstance(layer, RotatingKVCache):  # once the ring wrapped, every slot holds a token
        return min(offset, _length(keys))
    if isinstance(layer, ChunkedKVCache):  # the buffer starts at start_position
        return offset - layer.start_position
    if isinstance(layer, KVCache | QuantizedKVCache):
        return offset
    return None


def shrink(layer: Any) -> tuple[Any, Capacity]:
    """A shallow copy of `layer` holding only its used positions (views, no copy), and the
    capacity to regrow it to; the layer itself and None when nothing is unused."""
    if isinstance(layer, CacheList):
        parts = [shrink(c) for c in layer.caches]
        if all(cap is None for _, cap in parts):
            return layer, None
        out = copy.copy(layer)
        out.caches = type(layer.caches)(c for c, _ in parts)
        return out, [cap for _, cap in parts]
    n = used(layer)
    if n is None or not 0 <= n < _length(layer.keys):
        return layer, None
    out = copy.copy(layer)
    out.keys, out.values = _cut(layer.keys, n), _cut(layer.values, n)
    return out, _length(layer.keys)


def regrow(layer: Any, capacity: Capacity) -> Any:
    """The layer rebuilt from a file, padded back to the capacity `shrink` recorded (ValueError
    when the capacity does not fit the layer: the file is corrupt)."""
    if capacity is None:
        return layer
    if isinstance(layer, CacheList):
        if not isinstance(capacity, list) or len(capacity) != len(layer.caches):
            raise ValueError(f"capacity {capacity!r} for a CacheList")
        layer.caches = [regrow(c, cap) for c, cap in zip(layer.caches, capacity, strict=True)]
        return layer
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(capacity, int) or keys is None or values is None:
        raise ValueError(f"capacity {capacity!r} for a {type(layer).__name__}")
    if not _length(keys) < capacity <= _MAX_CAPACITY or _length(values) != _length(keys):
        raise ValueError(f"capacity {capacity} for {_length(keys)} stored positions")
    layer.keys, layer.values = _pad(keys, capacity), _pad(values, capacity)
    return layer
