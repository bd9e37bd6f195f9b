"""SSD entries hold only the positions a cache used, not its preallocated buffer, and restore to
caches that generate the same tokens and logprobs as the originals; older formats are misses."""

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, RotatingKVCache
from store.helpers import BIG, assert_same_cache, prompt_cache, quarantined, random_tokens, write

from mlxd.kv.rotating_quantized import to_quantized_rotating
from mlxd.store import ssd, ssd_format
from mlxd.store.layers import clone
from mlxd.store.ssd import SSDTier
from mlxd.store.ssd_format import content_key

PROMPT = random_tokens(3, 24)  # past gemma3's 16-token window
NEXT = [11, 22, 33]


def _positions(layer: Any) -> int:
    """Positions along the token axis of the layer's buffer."""
    keys = layer.keys[0] if isinstance(layer.keys, tuple | list) else layer.keys
    return keys.shape[2]


def _per_position(cache: list[Any]) -> float:
    """Bytes one position takes in every layer, from the layers' own buffers."""
    return sum(c.nbytes / _positions(c) for c in cache)


def test_a_file_is_its_used_positions_not_its_buffer(tiny_lm, tmp_path) -> None:
    """A 309-token prefix of a plain and of a quantized cache: mlx-lm preallocates 512
    positions; the file holds 309 of them plus a header."""
    model, tokens = tiny_lm("qwen3"), random_tokens(4, 309)
    plain = prompt_cache(model, tokens)
    quant = [c.to_quantized(group_size=64, bits=8) for c in plain]
    mx.eval([c.state for c in quant])
    tier = SSDTier(tmp_path, BIG)
    try:
        for name, cache in (("plain", plain), ("quantized", quant)):
            assert {_positions(c) for c in cache} == {512}
            size = write(tier, name, tokens, cache).nbytes
            used = 309 * _per_position(cache)
            assert used <= size <= used + 16_384, (name, size, used)  # header: ids, layer table
    finally:
        tier.close()


def _trimmed(model: Any) -> list[Any]:
    """Cut back 5 tokens: the positions past the offset still hold the cut tokens' keys."""
    cache = prompt_cache(model, PROMPT)
    for c in cache:
        c.trim(5)
    return cache


def _decoded(model: Any) -> list[Any]:
    """8 prompt tokens, then one decode step: the rotating layers grew a block of empty slots."""
    cache = prompt_cache(model, PROMPT[:8])
    model(mx.array([[7]]), cache=cache)
    mx.eval([c.state for c in cache])
    assert any(isinstance(c, RotatingKVCache) and c.offset < _positions(c) for c in cache)
    return cache


def _quantized(model: Any) -> list[Any]:
    """bf16 KV and rings as mlx-lm's QuantizedKVCache and mlxd's quantized ring."""
    cache = [
        to_quantized_rotating(c, 64, 8) if isinstance(c, RotatingKVCache) else c
        for c in prompt_cache(model, PROMPT)
    ]
    cache = [c.to_quantized(group_size=64, bits=8) if isinstance(c, KVCache) else c for c in cache]
    mx.eval([c.state for c in cache])
    return cache


CASES = {
    "qwen3": ("qwen3", lambda m: prompt_cache(m, PROMPT)),
    "qwen3-trimmed": ("qwen3", _trimmed),
    "gemma3-wrapped": ("gemma3", lambda m: prompt_cache(m, PROMPT)),
    "gemma3-decoded": ("gemma3", _decoded),
    "gemma3-quantized": ("gemma3", _quantized),
    "lfm2": ("lfm2", lambda m: prompt_cache(m, PROMPT)),
}


def _generate(model: Any, cache: list[Any]) -> tuple[list[int], list[bytes]]:
    """mlx-lm's own greedy loop from the cache: token ids and each step's logprobs, as bytes."""
    steps = list(generate_step(mx.array(NEXT), model, prompt_cache=cache, max_tokens=6))
    return [int(t) for t, _ in steps], [memoryview(lp).tobytes() for _, lp in steps]


@pytest.mark.parametrize("case", list(CASES))
def test_a_restored_entry_generates_the_same_bits(case: str, tiny_lm, tmp_path) -> None:
    arch, make = CASES[case]
    model = tiny_lm(arch)
    cache = make(model)
    tier = SSDTier(tmp_path, BIG)
    try:
        entry = write(tier, arch, PROMPT, cache)
        assert entry.nbytes < sum(c.nbytes for c in cache)  # not the whole buffers
        restored = tier.restore(entry)
    finally:
        tier.close()
    assert restored is not None
    assert_same_cache(cache, restored)
    tokens, logprobs = _generate(model, clone(cache))
    assert _generate(model, restored) == (tokens, logprobs)


def test_entries_of_an_older_format_are_misses_and_deleted(tmp_path, monkeypatch) -> None:
    """What the previous format wrote (whole buffers, in root/v2/) is never read: no crash, no
    hit, and its files do not sit outside the byte cap. Files that are not entries stay."""
    tokens, cache = PROMPT[:8], [KVCache()]
    cache[0].update_and_fetch(*(mx.ones((1, 2, 8, 16)),) * 2)
    with monkeypatch.context() as old:
        for module in (ssd, ssd_format):
            old.setattr(module, "FORMAT_VERSION", 2)
        old.setattr(ssd_format, "shrink", lambda layer: (layer, None))
        tier = SSDTier(tmp_path, BIG)
        write(tier, "ns", tokens, cache)
        tier.close()
    (tmp_path / "v2" / "notes.txt").write_text("mine")
    assert len(list((tmp_path / "v2").iterdir())) == 2

    tier = SSDTier(tmp_path, BIG)
    try:
        assert tier.match("ns", tokens + [1]) is None and tier.stats()["entries"] == 0
        assert [p.name for p in (tmp_path / "v2").iterdir()] == ["notes.txt"]
        assert quarantined(tier) == []
        entry = write(tier, "ns", tokens, cache)  # the new format takes its place
        assert entry.key == content_key("ns", tokens) and tier.restore(entry) is not None
    finally:
        tier.close()


def test_a_capacity_that_does_not_fit_is_quarantined(tmp_path, monkeypatch) -> None:
    """A file whose recorded capacity is smaller than what it holds is corrupt: never served."""
    cache = [KVCache()]
    cache[0].update_and_fetch(*(mx.ones((1, 2, 8, 16)),) * 2)
    real = ssd_format.shrink
    monkeypatch.setattr(ssd_format, "shrink", lambda layer: (real(layer)[0], 4))
    tier = SSDTier(tmp_path, BIG)
    try:
        entry = write(tier, "ns", PROMPT[:8], cache)
        assert tier.restore(entry) is None
        assert [p.name.split(".")[0] for p in quarantined(tier)] == [entry.key]
    finally:
        tier.close()
