"""Shared by the SSD tier tests: prompt caches (real tiny models and small synthetic ones) and
exact comparisons of cache states (dtype, shape and raw bytes, so NaNs and bf16 compare too)."""

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, make_prompt_cache

from mlxd.store.ssd import SSDTier
from mlxd.store.ssd_format import content_key

BIG = 1 << 30


def prompt_cache(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def next_logits(model: Any, cache: list[Any], tokens: list[int]) -> mx.array:
    out = model(mx.array([tokens]), cache=cache)
    mx.eval(out)
    return out


def kv_cache(seed: int, length: int = 8, dim: int = 16) -> list[Any]:
    """A small one-layer trimmable cache whose bytes depend on `seed`."""
    layer = KVCache()
    k = mx.random.normal((1, 2, length, dim), key=mx.random.key(seed))
    layer.update_and_fetch(k, k * 2)
    mx.eval(layer.state)
    return [layer]


def arrays_cache(seed: int) -> list[Any]:
    """A one-layer cache that cannot be trimmed (recurrent state)."""
    layer = ArraysCache(2)
    layer[0] = mx.random.normal((1, 3, 8), key=mx.random.key(seed))
    mx.eval(layer.state)
    return [layer]


def raw(a: mx.array) -> tuple[Any, tuple[int, ...], bytes]:
    return a.dtype, tuple(a.shape), memoryview(a).tobytes()


def assert_same(a: mx.array, b: mx.array) -> None:
    assert raw(a) == raw(b)
    assert mx.array_equal(a, b, equal_nan=True).item()


def assert_same_tree(a: Any, b: Any) -> None:
    """Same structure (tuple vs list too), bit-equal arrays, equal scalars."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, mx.array):
        assert_same(a, b)
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    else:
        assert a == b


def layout(node: Any) -> Any:
    """The state tree with each array as (dtype, shape): bookkeeping and buffer sizes."""
    if isinstance(node, mx.array):
        return (node.dtype, tuple(node.shape))
    if isinstance(node, tuple | list):
        return type(node)(layout(x) for x in node)
    return node


def assert_same_layer(original: Any, restored: Any) -> None:
    """Bit-equal in the positions a step reads (mlx-lm's keys_and_values), same buffer shapes
    and bookkeeping; a layer without a token buffer bit-equal in its whole state."""
    assert type(original) is type(restored)
    if isinstance(original, CacheList):
        assert len(original.caches) == len(restored.caches)
        for c, r in zip(original.caches, restored.caches, strict=True):
            assert_same_layer(c, r)
    elif getattr(original, "keys", None) is not None and hasattr(original, "keys_and_values"):
        assert_same_tree(original.keys_and_values(), restored.keys_and_values())
        assert layout(original.state) == layout(restored.state)
    else:
        assert_same_tree(original.state, restored.state)


def assert_same_cache(original: list[Any], restored: list[Any]) -> None:
    assert len(original) == len(restored)
    for c, r in zip(original, restored, strict=True):
        assert_same_layer(c, r)


def snapshot(cache: list[Any]) -> list[Any]:
    """Host copies of every state leaf, to compare against after the cache moved on."""

    def snap(node: Any) -> Any:
        if isinstance(node, mx.array):
            return raw(node)
        if isinstance(node, tuple | list):
            return type(node)(snap(x) for x in node)
        return node

    return [(type(c), snap(c.state)) for c in cache]


def files(tier: SSDTier) -> list[Path]:
    return sorted(p for p in tier.dir.iterdir())


def disk_bytes(tier: SSDTier) -> int:
    return sum(p.stat().st_size for p in files(tier))


def quarantined(tier: SSDTier) -> list[Path]:
    return sorted(tier.quarantine_dir.iterdir())


def write(tier: SSDTier, namespace: str, tokens: list[int], cache: list[Any], kind="assistant"):
    """Submit, wait for the writer, return the index entry."""
    assert tier.submit(namespace, tokens, cache, kind)
    assert tier.flush(10)
    key = content_key(namespace, tokens)
    (entry,) = [e for e in tier.index.entries() if e.key == key]
    return entry


def random_tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 150_000, n).tolist()
