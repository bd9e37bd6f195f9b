"""What the store needs to know about a prompt cache (a list of mlx-lm cache layers): its bytes,
whether it can be cut back, and a copy-on-write clone cut to a prefix."""

import copy
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, trim_prompt_cache


def nbytes(cache: list[Any]) -> int:
    """The buffers the layers hold (whole allocations, as mlx-lm counts them)."""
    return sum(c.nbytes for c in cache)


def trimmable(cache: list[Any]) -> bool:
    return can_trim_prompt_cache(cache)


def clone(cache: list[Any], drop: int = 0) -> list[Any]:
    """A clone sharing the donor's buffers: MLX arrays are values, so the clone's first write
    copies (slice updates never donate a shared buffer) and the donor stays intact."""
    out = copy.deepcopy(cache)
    if drop:
        trim_prompt_cache(out, drop)
    return out


def evaluate(cache: list[Any]) -> None:
    """Schedule the layers' state, so a stored entry holds buffers and no pending graph. Not
    waited for: a wait here stalled the engine at every snapshot and finished row until the
    GPU caught up (the step in flight, then each copy), and a later use waits if it must."""
    mx.async_eval([v for c in cache for _, v in tree_flatten(c.state) if isinstance(v, mx.array)])


def compact(cache: list[Any]) -> list[Any]:
    """Plain KV layers copied into buffers holding exactly their tokens: the layout a row that
    prefilled on the deterministic grid has. On a GPU, a decode step's bits can depend on the
    buffer's stride, not only on the values in it."""
    for c in cache:
        if type(c) is KVCache and c.keys is not None and c.keys.shape[2] != c.offset:
            c.keys = mx.contiguous(c.keys[..., : c.offset, :])
            c.values = mx.contiguous(c.values[..., : c.offset, :])
    return cache
