"""Quantized-KV rows under continuous batching: they join, leave and are
filtered in a running batch of their format, and each row's tokens and logprobs equal its solo
mlx-lm run with the same --kv-bits / --kv-group-size / --quantized-kv-start.

The solo oracle is mlx-lm's `generate_step` (what `mlx_lm.generate` and `mlx_lm.server` run for
`--kv-bits`: the server never batches them). Every row is compared exactly, padded rows
included: on the CPU the masked columns add exact zeros (tests/kv/test_batch_quantized_model.py
shows the same at the cache level), so the envelope for padded rows is zero here.
"""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams
from mlxd.kv.batch_quantized import BatchQuantizedKVCache

TEXTS = [
    "Hello there my friend, how are you today? I hope all is well with you and yours.",
    "x y",
    "Tell me a story about a cat",
    "Write a poem about the sea, the sky and the long road home, please",
]


def _solo(model, prompt: list[int], n: int, seed: int | None, **kv) -> list[tuple[int, mx.array]]:
    sampler = None
    if seed is not None:
        mx.random.seed(seed)
        sampler = make_sampler(temp=1.0, top_k=50)
    return list(generate_step(mx.array(prompt), model, max_tokens=n, sampler=sampler, **kv))


def _req(prompt: list[int], n: int, seed: int | None, **kv) -> GenerationRequest:
    sampling = SamplingParams(temp=1.0, top_k=50) if seed is not None else None
    return GenerationRequest(
        prompt=mx.array(prompt), max_tokens=n, sampling=sampling, seed=seed, **kv
    )


def _same(events: list, solo: list) -> None:
    assert [e.token for e in events] == [t for t, _ in solo]
    for e, (_, lp) in zip(events, solo, strict=True):
        assert mx.array_equal(e.logprobs, lp).item()


@pytest.fixture
def widest(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most rows one quantized attention call has held (proof that rows shared it)."""
    seen = [0]
    update = BatchQuantizedKVCache.update_and_fetch

    def spy(self, keys, values):
        seen[0] = max(seen[0], keys.shape[0])
        return update(self, keys, values)

    monkeypatch.setattr(BatchQuantizedKVCache, "update_and_fetch", spy)
    return seen


def _model(tiny_model: Callable[..., Path], arch: str):
    return load(str(tiny_model(arch)))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_rows_cross_into_a_quantized_batch_with_their_solo_bits(
    tiny_model, widest: list[int], arch: str, bits: int, group: int
) -> None:
    """Starts chosen so rows convert during prefill, during decode at different steps, and
    never; one row is unquantized. Different max_tokens make rows leave at different steps."""
    model, tok = _model(tiny_model, arch)
    prompts = [tok.encode(t) for t in TEXTS]
    lengths = [len(p) for p in prompts]
    plan = [  # (start, max_tokens, seed)
        (lengths[0] - 5, 14, None),  # prefill reaches the start: it prefills alone, then joins
        (lengths[1] + 3, 12, 7),  # crosses on its 4th decode step
        (lengths[2] + 6, 10, None),  # crosses later
        (None, 12, 3),  # unquantized: stays in the bf16 batch
    ]
    reqs, solos = [], []
    for prompt, (start, n, seed) in zip(prompts, plan, strict=True):
        kv = (
            {}
            if start is None
            else dict(kv_bits=bits, kv_group_size=group, quantized_kv_start=start)
        )
        solos.append(_solo(model, prompt, n, seed, **kv))
        reqs.append(_req(prompt, n, seed, **kv))
    engine = Engine(model)
    try:
        handles = engine.submit_many(reqs)
        for handle, solo in zip(handles, solos, strict=True):
            _same(list(handle), solo)
            assert handle.done is not None and handle.done.reason == "length"
        assert engine.paths["quantized prefill"] == 1
        assert engine.paths["crossed to quantized"] == 2
        assert widest[0] >= 2  # rows of both kinds shared quantized attention
    finally:
        engine.close()


def test_a_quantized_row_joins_a_running_quantized_batch(tiny_model, widest: list[int]) -> None:
    """Two rows already decode on quantized KV when a third arrives (extend), and rows leave
    while others go on (filter); the lone last row returns to serial caches exactly."""
    model, tok = _model(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    kv = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=4)
    sizes = [(24, 5), (8, None), (30, 9)]
    solos = [_solo(model, p, n, s, **kv) for p, (n, s) in zip(prompts, sizes, strict=True)]
    engine = Engine(model)
    try:
        pairs = zip(prompts[:2], sizes[:2], strict=True)
        first = engine.submit_many([_req(p, n, s, **kv) for p, (n, s) in pairs])
        it = iter(first[0])
        head = [next(it) for _ in range(6)]  # both rows are decoding, quantized, by now
        late = engine.submit(_req(prompts[2], sizes[2][0], sizes[2][1], **kv))
        _same(head + list(it), solos[0])
        _same(list(first[1]), solos[1])
        _same(list(late), solos[2])
        assert widest[0] >= 2
        assert engine.paths["batched->serial"] >= 1
    finally:
        engine.close()


def test_gemma3_rotating_layers_still_raise_mlx_lm_s_error_in_the_batch(tiny_model) -> None:
    """Until quantized rotating caches land, a batched row reaching its start fails as mlx-lm
    fails alone (the server refuses such requests before any work: kv/schemes.py)."""
    model, tok = _model(tiny_model, "gemma3")
    prompt = tok.encode(TEXTS[2])
    kv = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=len(prompt) + 2)
    solo: list[int] = []
    with pytest.raises(NotImplementedError, match="RotatingKVCache Quantization NYI"):
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=8, **kv):
            solo.append(token)
    engine = Engine(model)
    try:
        bad, good = engine.submit_many([_req(prompt, 8, None, **kv), _req(prompt, 8, None)])
        tokens: list[int] = []
        with pytest.raises(NotImplementedError, match="RotatingKVCache Quantization NYI"):
            for event in bad:
                tokens.append(event.token)
        assert tokens == solo and len(solo) >= 1  # the same tokens before the same error
        assert len(list(good)) == 8 and good.done.reason == "length"
    finally:
        engine.close()


def test_mixed_kv_config_rows_batch_with_optiq_s_bits(tiny_model, widest, monkeypatch) -> None:
    """kv_config rows (layer 0 unquantized, layer 1 4-bit) converted in prefill and while
    decoding share one quantized batch; each equals generate_step under optiq's hook (the
    op-for-op reference of install_mixed_kv: tests/kv/test_mixed_kv.py checks it live)."""
    import sys

    from fixtures.optiq_reference import optiq_hook

    from mlxd.kv import mixed

    model, tok = _model(tiny_model, "llama")
    raw = [{"layer_idx": 1, "bits": 4, "group_size": 32}]
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    starts = [len(prompts[0]) - 4, len(prompts[1]) + 2, len(prompts[2]) + 5]
    with monkeypatch.context() as m:  # optiq's way: its hook in place of mlx-lm's
        m.setattr(sys.modules["mlx_lm.generate"], "maybe_quantize_kv_cache", optiq_hook(raw))
        solos = [
            list(generate_step(mx.array(p), model, max_tokens=10, kv_bits=4, quantized_kv_start=s))
            for p, s in zip(prompts, starts, strict=True)
        ]
    cfg = mixed.parse(raw)
    reqs = [
        GenerationRequest(prompt=mx.array(p), max_tokens=10, kv_config=cfg, quantized_kv_start=s)
        for p, s in zip(prompts, starts, strict=True)
    ]
    engine = Engine(model)
    try:
        for handle, solo in zip(engine.submit_many(reqs), solos, strict=True):
            _same(list(handle), solo)
        assert engine.paths["quantized prefill"] == 1
        assert engine.paths["crossed to quantized"] == 2
        assert widest[0] >= 2
    finally:
        engine.close()


def test_gemma3_sliding_window_rows_batch_quantized(tiny_model, monkeypatch) -> None:
    """quantize_windows (the server's setting): gemma3's sliding-window layers become quantized
    rings, solo and batched. Solo bits are mlx-optiq's (tests/kv/test_rotating_quantized.py
    checks them live); here each batched row gets its solo tokens, and its logprobs stay
    within 1e-2 of them: a row whose ring is not aligned with the batch's attends the same
    quantized tokens in another slot order (sums in another order, as mlx-lm's bf16
    BatchRotatingKVCache does against its solo ring; measured <= 2.5e-5, once 5.1e-3 when the
    noise flipped one quantized code)."""
    from mlxd.kv.batch_rotating_quantized import BatchRotatingQuantizedKVCache

    widest, update = [0], BatchRotatingQuantizedKVCache.update_and_fetch

    def spy(self, keys, values):
        widest[0] = max(widest[0], keys.shape[0])
        return update(self, keys, values)

    monkeypatch.setattr(BatchRotatingQuantizedKVCache, "update_and_fetch", spy)
    model, tok = _model(tiny_model, "gemma3")
    prompts = [tok.encode(t) for t in TEXTS]
    starts = [len(prompts[0]) - 3, len(prompts[1]) + 2, 0, len(prompts[3]) + 20]
    reqs = [
        lambda p=p, s=s: _req(
            p, 24, None, kv_bits=4, kv_group_size=32, quantized_kv_start=s, quantize_windows=True
        )  # fmt: skip
        for p, s in zip(prompts, starts, strict=True)
    ]
    solo_engine = Engine(model, batch=1)
    try:
        solos = [[(e.token, e.logprobs) for e in solo_engine.submit(r())] for r in reqs]
    finally:
        solo_engine.close()
    engine = Engine(model)
    try:
        for handle, solo in zip(engine.submit_many([r() for r in reqs]), solos, strict=True):
            events = list(handle)
            assert [e.token for e in events] == [t for t, _ in solo]
            for e, (_, lp) in zip(events, solo, strict=True):
                assert mx.abs(e.logprobs - lp).max().item() < 1e-2
        assert widest[0] >= 2
    finally:
        engine.close()
