"""SSD tier fidelity: what is restored is bit-equal to what was submitted and decodes the same."""

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)
from store.helpers import (
    BIG,
    assert_same,
    assert_same_cache,
    next_logits,
    prompt_cache,
    random_tokens,
    write,
)

from mlxd.store.ssd import SSDTier

PROMPT = random_tokens(1, 24)  # longer than gemma3's 16-token window: its rotating layers wrap
NEXT = [11, 22, 33]


def _quantize(cache: list[Any]) -> list[Any]:
    return [c.to_quantized(group_size=64, bits=8) if isinstance(c, KVCache) else c for c in cache]


CASES = {
    "qwen3": ("qwen3", None, {KVCache}),
    "llama": ("llama", None, {KVCache}),
    "gemma3": ("gemma3", None, {KVCache, RotatingKVCache}),
    "lfm2": ("lfm2", None, {KVCache, ArraysCache}),
    "qwen3_moe": ("qwen3_moe", None, {KVCache}),
    "phi3": ("phi3", None, {KVCache}),
    "qwen3-quantized": ("qwen3", _quantize, {QuantizedKVCache}),
    "lfm2-quantized": ("lfm2", _quantize, {QuantizedKVCache, ArraysCache}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_is_bit_exact_and_decodes_the_same(case: str, tiny_lm, tmp_path) -> None:
    arch, convert, classes = CASES[case]
    model = tiny_lm(arch)
    cache = prompt_cache(model, PROMPT)
    if convert is not None:
        cache = convert(cache)
        mx.eval([c.state for c in cache])
    assert {type(c) for c in cache} == classes
    tier = SSDTier(tmp_path, BIG)
    try:
        entry = write(tier, f"{arch}|fp", PROMPT, cache, kind="user")
        assert (entry.tokens, entry.kind) == (tuple(PROMPT), "user")
        assert entry.trimmable == all(c.is_trimmable() for c in cache)
        assert entry.nbytes == (tier.dir / entry.key).stat().st_size
        restored = tier.restore(entry)
        assert restored is not None
        assert_same_cache(cache, restored)
        assert_same(next_logits(model, cache, NEXT), next_logits(model, restored, NEXT))
        assert tier.stats()["restored"] == 1
    finally:
        tier.close()


def test_gemma3_not_trimmable_once_the_window_wrapped(tiny_lm, tmp_path) -> None:
    """Non-vacuous check of `trimmable`: a wrapped rotating layer cannot be cut back."""
    tier = SSDTier(tmp_path, BIG)
    try:
        short = write(tier, "g", PROMPT[:8], prompt_cache(tiny_lm("gemma3"), PROMPT[:8]))
        long = write(tier, "g", PROMPT, prompt_cache(tiny_lm("gemma3"), PROMPT))
        assert short.trimmable and not long.trimmable
    finally:
        tier.close()


def _odd_layers() -> list[Any]:
    """Classes and dtypes the tiny models do not produce: bf16 / fp16 / int arrays, strided
    (transposed) arrays, None and nested lists in state, CacheList, ChunkedKVCache."""
    key = mx.random.key(7)
    kv = KVCache()
    kv.update_and_fetch(*(mx.random.normal((1, 2, 5, 8), key=key).astype(mx.bfloat16),) * 2)
    chunked = ChunkedKVCache(chunk_size=4)
    chunked.update_and_fetch(*(mx.random.normal((1, 1, 6, 8), key=key).astype(mx.float16),) * 2)
    chunked.maybe_trim_front()
    arrays = ArraysCache(3)
    arrays[0] = mx.random.normal((1, 8, 3), key=key).transpose(0, 2, 1)  # not row-contiguous
    arrays[2] = mx.arange(6, dtype=mx.int32).reshape(2, 3)
    rot = RotatingKVCache(max_size=4, keep=1)
    for i in range(6):
        rot.update_and_fetch(*(mx.full((1, 1, 1, 8), float(i)),) * 2)
    inner = KVCache()
    inner.update_and_fetch(*(mx.ones((1, 1, 3, 8), dtype=mx.bfloat16),) * 2)
    layers = [kv, chunked, arrays, rot, CacheList(inner, ArraysCache(1))]
    mx.eval([c.state for c in layers])
    return layers


def test_round_trip_of_other_classes_and_dtypes(tmp_path) -> None:
    layers = _odd_layers()
    tier = SSDTier(tmp_path, BIG)
    try:
        entry = write(tier, "odd", list(range(9)), layers)
        restored = tier.restore(entry)
        assert restored is not None
        assert_same_cache(layers, restored)
        assert restored[0].keys.dtype == mx.bfloat16 and restored[1].keys.dtype == mx.float16
    finally:
        tier.close()


def test_entries_are_the_users_alone(tmp_path) -> None:
    """Entries hold the prompt's token ids: folders 0700, files 0600, whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    tier = SSDTier(tmp_path / "ssd", BIG)
    try:
        entry = write(tier, "private", list(range(9)), _odd_layers())
        assert tier.restore(entry) is not None
    finally:
        tier.close()
        os.umask(old)
    for folder in (tier.dir, tier.quarantine_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [p for p in tier.dir.iterdir() if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
