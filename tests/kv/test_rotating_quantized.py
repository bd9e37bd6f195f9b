"""RotatingQuantizedKVCache (one row, sliding window, quantized) and to_quantized_rotating.

Two oracles:
- CI reference (always runs): mlx-lm's own bf16 RotatingKVCache fed the same updates, then
  `mx.quantize`. Groups run along the head dimension, so quantizing a whole ring equals
  quantizing each position as it arrives; and every ring operation (trim, rotate, temporal
  order, conversion) only moves whole positions. So slot for slot, the quantized ring must hold
  `mx.quantize` of what mlx-lm's ring holds, after any updates, wrapped or not, converted at any
  point. Under tiny gemma3 the same wrapper (mlx-lm's ring, quantized on read) is a cache the
  model accepts, so decode logits through ours must equal it exactly.
- mlx-optiq 0.7.7 live (when its interpreter exists: MLXD_OPTIQ_PYTHON or
  /work/optiq-venv/bin/python): its RotatingQuantizedKVCache and its conversions
  (`to_quantized` patch, `quantize_cache_layer`) in a subprocess (tests/fixtures/optiq_oracle.py),
  compared on every returned tuple, the whole buffers, offset / _idx and the model's logits.
"""

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from fixtures.optiq_oracle import run_optiq
from fixtures.optiq_python import needs_optiq
from mlx_lm import load
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from mlxd.kv.rotating_quantized import RotatingQuantizedKVCache, to_quantized_rotating

H, D, WINDOW = 2, 64, 16
# keep, chunk lengths (1: a decode step, >1: a prefill chunk), where to convert from bf16
SCENARIOS = {
    "decode-wraps": (0, [5] + [1] * 30, [0, 1, 15]),
    "prefill-overshoots": (0, [20] + [1] * 20, [0, 1, 4]),
    "prefill-after-wrap": (0, [3, 4] + [1] * 20 + [7] + [1] * 5, [0, 2, 20, 23]),
    "keep": (3, [6] + [1] * 25 + [4] + [1] * 3, [0, 12, 27]),
    "token-by-token": (0, [1] * 40, [0, 10, 30]),
}
CASES = [(name, c) for name, (_, _, conv) in SCENARIOS.items() for c in conv]
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away from the farm."


def _kv(n: int, key: int) -> tuple[mx.array, mx.array]:
    k = mx.random.normal((1, H, n, D), key=mx.random.key(key)).astype(mx.bfloat16)
    v = mx.random.normal((1, H, n, D), key=mx.random.key(key + 7919)).astype(mx.bfloat16)
    return k, v


def _same(got: Any, want: Any) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert mx.array_equal(a, b).item()


def _quantized(x: mx.array, group: int, bits: int) -> tuple[mx.array, ...]:
    return tuple(mx.quantize(x, group_size=group, bits=bits))


@pytest.mark.parametrize("name,convert", CASES)
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
def test_the_ring_holds_the_quantized_bf16_ring(name: str, convert: int, bits: int, group: int):
    keep, chunks, _ = SCENARIOS[name]
    ref = RotatingKVCache(WINDOW, keep)
    ours: Any = RotatingQuantizedKVCache(WINDOW, keep, group_size=group, bits=bits)
    ours = RotatingKVCache(WINDOW, keep) if convert else ours
    for i, n in enumerate(chunks):
        if i == convert and i > 0:
            ours = to_quantized_rotating(ours, group_size=group, bits=bits)
            assert to_quantized_rotating(ours, group, bits) is ours is ours.to_quantized()
        k, v = _kv(n, i)
        want_k, want_v = ref.update_and_fetch(k, v)
        got_k, got_v = ours.update_and_fetch(k, v)
        assert (ours.offset, ours._idx, ours.size()) == (ref.offset, ref._idx, ref.size())
        if isinstance(ours, RotatingQuantizedKVCache):
            _same(got_k, _quantized(want_k, group, bits))
            _same(got_v, _quantized(want_v, group, bits))
            # the slots a later step can read (stale ones past a short offset are never read)
            used = min(ref.offset, ref.keys.shape[2])
            held = [x[..., :used, :] for x in ours.keys]
            _same(held, _quantized(ref.keys[..., :used, :], group, bits))
            for m in (1, 4):  # the masks the model asks for, from the same bookkeeping
                want, got = ref.make_mask(m, window_size=WINDOW), ours.make_mask(m, WINDOW)
                assert type(got) is type(want)
                assert not isinstance(want, mx.array) or mx.array_equal(got, want).item()
    assert ours.nbytes == sum(x.nbytes for x in (*ours.keys, *ours.values))


def test_state_round_trips_and_trim_matches_mlx_lm() -> None:
    ref, ours = RotatingKVCache(WINDOW), RotatingQuantizedKVCache(WINDOW, group_size=64, bits=4)
    for c in (ref, ours):
        c.update_and_fetch(*_kv(9, 1))
    assert ours.is_trimmable() and ours.trim(3) == ref.trim(3) == 3
    back = RotatingQuantizedKVCache.from_state(copy.deepcopy(ours.state))
    assert (back.offset, back._idx, back.max_size, back.group_size, back.bits) == (6, 6, 16, 64, 4)
    k, v = _kv(1, 2)
    want_k, want_v = ref.update_and_fetch(k, v)
    for c in (ours, back):
        got_k, got_v = c.update_and_fetch(k, v)
        _same(got_k, _quantized(want_k, 64, 4))
        _same(got_v, _quantized(want_v, 64, 4))
        assert (c.offset, c._idx) == (ref.offset, ref._idx) == (7, 7)


def _prefill(model: Any, prompt: list[int], bf16_steps: int) -> tuple[list, mx.array, list]:
    """prompt[:-1] prefilled, then `bf16_steps` greedy tokens decoded unquantized."""
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    tok, logits = mx.array([[prompt[-1]]]), []
    for _ in range(bf16_steps):
        logits.append(model(tok, cache=cache)[:, -1, :])
        tok = mx.argmax(logits[-1], axis=-1, keepdims=True)
    return cache, tok, logits


def _decode(model: Any, tok: mx.array, cache: list, steps: int) -> tuple[list[int], list]:
    ids, logits = [], []
    for _ in range(steps):
        logits.append(model(tok, cache=cache)[:, -1, :])
        tok = mx.argmax(logits[-1], axis=-1, keepdims=True)
        ids.append(tok.item())
    return ids, logits


class _QuantizedOnRead:
    """The reference: mlx-lm's bf16 ring does all the bookkeeping (offset, masks); reads are
    quantized."""

    def __init__(self, ring: RotatingKVCache, group: int, bits: int) -> None:
        self.ring, self.group_size, self.bits = ring, group, bits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ring, name)

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[tuple, tuple]:
        k, v = self.ring.update_and_fetch(k, v)
        g, b = self.group_size, self.bits
        return _quantized(k, g, b), _quantized(v, g, b)


def _convert(cache: list, group: int, bits: int, rotating: Callable[[Any], Any]) -> list:
    return [
        rotating(c) if isinstance(c, RotatingKVCache) else c.to_quantized(group, bits)
        for c in cache
    ]


@pytest.mark.parametrize("bf16_steps", [0, 20])  # converted after prefill / with a rotated ring
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
def test_gemma3_decodes_as_the_reference(tiny_model, bf16_steps: int, bits: int, group: int):
    model, tok = load(str(tiny_model("gemma3")))
    prompt = tok.encode(TEXT)
    assert len(prompt) > WINDOW + 1  # the prefill overshoots the window
    steps = 24  # past another wrap

    cache, last, _ = _prefill(model, prompt, bf16_steps)
    ours = _convert(cache, group, bits, lambda c: to_quantized_rotating(c, group, bits))
    assert any(isinstance(c, RotatingQuantizedKVCache) for c in ours)
    assert any(isinstance(c, QuantizedKVCache) for c in ours)
    ids, logits = _decode(model, last, ours, steps)

    cache, last, _ = _prefill(model, prompt, bf16_steps)
    ref = _convert(cache, group, bits, lambda c: _QuantizedOnRead(c, group, bits))
    ref_ids, ref_logits = _decode(model, last, ref, steps)
    assert ids == ref_ids
    for a, b in zip(logits, ref_logits, strict=True):
        assert mx.array_equal(a, b).item()
    rings = [c for c in ours if isinstance(c, RotatingQuantizedKVCache)]
    assert all(c._idx < c.offset for c in rings)  # the window wrapped while quantized
    assert copy.deepcopy(rings[0]).offset == rings[0].offset


# mlx-optiq, live
@needs_optiq
@pytest.mark.parametrize("name,convert", CASES)
def test_same_bits_as_optiq(tmp_path: Path, name: str, convert: int) -> None:
    keep, chunks, _ = SCENARIOS[name]
    bits, group = 4, 64
    inputs = {}
    for i, n in enumerate(chunks):
        inputs[f"k{i}"], inputs[f"v{i}"] = _kv(n, i)
    spec = dict(mode="cache", max_size=WINDOW, keep=keep, group_size=group, bits=bits,
                chunks=chunks, convert_after=convert)  # fmt: skip
    want, ints = run_optiq(tmp_path, spec, inputs)

    cache: Any = RotatingQuantizedKVCache(WINDOW, keep, group_size=group, bits=bits)
    cache = RotatingKVCache(WINDOW, keep) if convert else cache
    seen = 0
    for i in range(len(chunks)):
        if i == convert and i > 0:
            cache = to_quantized_rotating(cache, group_size=group, bits=bits)
            _same(cache.keys, [want[f"converted_k.{j}"] for j in range(3)])
            _same(cache.values, [want[f"converted_v.{j}"] for j in range(3)])
        k, v = cache.update_and_fetch(inputs[f"k{i}"], inputs[f"v{i}"])
        if isinstance(cache, RotatingQuantizedKVCache):
            _same(k, [want[f"ret_k{i}.{j}"] for j in range(3)])
            _same(v, [want[f"ret_v{i}.{j}"] for j in range(3)])
            seen += 1
    _same(cache.keys, [want[f"final_k.{j}"] for j in range(3)])
    _same(cache.values, [want[f"final_v.{j}"] for j in range(3)])
    assert (cache.offset, cache._idx) == (ints["offset"], ints["idx"])
    assert seen == len(chunks) - convert


@needs_optiq
@pytest.mark.parametrize("bf16_steps", [0, 20])
def test_gemma3_logits_equal_optiq(tmp_path: Path, tiny_model, bf16_steps: int) -> None:
    path = tiny_model("gemma3")
    model, tok = load(str(path))
    prompt, bits, group, steps = tok.encode(TEXT), 4, 64, 24
    spec = dict(mode="model", model=str(path), prompt=prompt, bf16_steps=bf16_steps,
                steps=steps, group_size=group, bits=bits)  # fmt: skip
    want, ints = run_optiq(tmp_path, spec, {})

    cache, last, bf16_logits = _prefill(model, prompt, bf16_steps)
    cache = _convert(cache, group, bits, lambda c: to_quantized_rotating(c, group, bits))
    ids, logits = _decode(model, last, cache, steps)
    all_logits = bf16_logits + logits
    assert ids == ints["ids"][bf16_steps:]
    for i, got in enumerate(all_logits):
        assert mx.array_equal(got, want[f"logits{i}"]).item(), f"step {i}"
    for i, c in enumerate(cache):
        if isinstance(c, RotatingQuantizedKVCache):
            _same(c.keys, [want[f"layer{i}_k.{j}"] for j in range(3)])
            _same(c.values, [want[f"layer{i}_v.{j}"] for j in range(3)])
