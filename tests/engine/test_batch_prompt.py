"""Batched prefill without mlx-lm's buffer-cache clears (`prefill.py`): the same tokens and
logprob arrays as BatchGenerator, over padded, multi-chunk prompts; the cache keeps its buffers;
`--prefill-clear-cache auto` is off on CUDA only."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs
from mlx_lm.generate import PromptProcessingBatch
from mlx_lm.models.cache import make_prompt_cache

from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.prefill import KeptBuffersPromptBatch, clears_cache
from mlxd.engine.request import GenerationRequest

TEXTS = ["Hello there my friend, how are you today?", "x", "Tell me a long story about a cat"]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts KeptBuffersPromptBatch.prompt calls (the path taken)."""
    calls: list[int] = []
    inner = KeptBuffersPromptBatch.prompt

    def counting(self, tokens):
        calls.append(len(tokens))
        return inner(self, tokens)

    monkeypatch.setattr(KeptBuffersPromptBatch, "prompt", counting)
    return calls


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_kept_buffers_give_batch_generator_bits(
    tiny_model: Callable[..., Path], arch: str, spy: list[int]
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model(arch)))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    ref = batch_generator_outputs(model, prompts, 8, eos, prefill_step_size=4)
    engine = Engine(model, config=EngineConfig(8, 8, 4, clear_cache=False))
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=8, stop_token_ids=eos) for p in prompts
        ]
        got = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
    finally:
        engine.close()
    assert_same_outputs(got, ref)
    # The two longer prompts were prefilled together in chunks of 4 through the kept path ("x"
    # has no token to prefill).
    assert spy.count(2) >= 2


def _prefill(cls: type, model, prompts: list[list[int]]) -> tuple[list, int]:
    caches = [make_prompt_cache(model) for _ in prompts]
    batch = cls(model, list(range(len(prompts))), caches, prefill_step_size=4)
    mx.clear_cache()
    batch.prompt(prompts)
    return [c.state for c in batch.prompt_cache], mx.get_cache_memory()


def test_the_buffer_cache_is_kept_and_the_cache_arrays_are_the_same(
    tiny_model: Callable[..., Path],
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    prompts = [tok.encode(t) for t in TEXTS]  # unequal lengths: right padding, then the roll
    theirs, cached_theirs = _prefill(PromptProcessingBatch, model, prompts)
    ours, cached_ours = _prefill(KeptBuffersPromptBatch, model, prompts)
    for a, b in zip(theirs, ours, strict=True):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))
    assert cached_ours > 1000 * max(cached_theirs, 1), (cached_theirs, cached_ours)


def test_auto_is_off_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    assert (clears_cache("auto"), clears_cache("on"), clears_cache("off")) == (False, True, False)
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    assert (clears_cache("auto"), clears_cache("on"), clears_cache("off")) == (True, True, False)


@pytest.mark.parametrize("clears", [True, False])
def test_the_engine_clears_the_buffer_cache_only_when_configured(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, clears: bool
) -> None:
    """Off (CUDA's auto), none of the engine's own clears run: a serial row's prefill chunks and
    its end, a batch's prefill and its close. On, mlx-lm's places clear as before."""
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    calls: list[int] = []
    clear = mx.clear_cache
    monkeypatch.setattr(mx, "clear_cache", lambda: (calls.append(1), clear())[1])
    config = EngineConfig(4, 4, 8, clear_cache=clears)  # 8-token chunks: multi-chunk prefills
    engine = Engine(model, batch=4, prefill_step_size=8, config=config)
    try:
        lone = engine.submit(GenerationRequest(prompt=mx.array(tok.encode(TEXTS[0])), max_tokens=4))
        lone.wait()
        assert engine.paths == {"serial": 1}
        handles = engine.submit_many(
            [GenerationRequest(prompt=mx.array(tok.encode(t)), max_tokens=4) for t in TEXTS]
        )
        for h in handles:
            h.wait()
        assert engine.paths["batched"] == 3
    finally:
        engine.close()
    assert (len(calls) > 0) == clears


def test_a_closing_batch_clears_only_after_its_last_tokens_went_out(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clear at a batch's close waits for the GPU's work in flight; the rows' last token
    and done events are handed out before it, so no reader waits for the clear."""
    from mlx_lm import load

    from mlxd.engine.request import RequestHandle

    model, tok = load(str(tiny_model("qwen3")))
    log: list[str] = []
    clear, put = mx.clear_cache, RequestHandle.put_quiet
    monkeypatch.setattr(mx, "clear_cache", lambda: (log.append("clear"), clear())[1])
    monkeypatch.setattr(
        RequestHandle, "put_quiet", lambda h, e: (log.append(type(e).__name__), put(h, e))[1]
    )
    engine = Engine(model, batch=4, config=EngineConfig(4, 4, 2048, clear_cache=True))
    try:
        handles = engine.submit_many(
            [GenerationRequest(prompt=mx.array(tok.encode(t)), max_tokens=3) for t in TEXTS]
        )
        for h in handles:
            h.wait()
    finally:
        engine.close()
    assert engine.paths["batched"] == 3
    last_done = max(i for i, x in enumerate(log) if x == "DoneEvent")
    assert log[last_done + 1 :] == ["clear"]  # the close's clear, after every event


@pytest.mark.parametrize("leaving", [[0, 1, 2], [0, 2]])
def test_a_wave_done_prefilling_moves_to_decoding_without_a_copy(
    tiny_model: Callable[..., Path], leaving: list[int]
) -> None:
    """`split` of every row (a whole wave done prefilling) hands the same cache arrays over;
    mlx-lm deep-copies and gathers them. Any split leaves mlx-lm's rows and arrays."""
    from mlx_lm import load

    from mlxd.kv.batch_roll import rolling

    model, tok = load(str(tiny_model("qwen3")))
    prompts = [tok.encode(t) for t in TEXTS]
    out = []
    for cls in (PromptProcessingBatch, KeptBuffersPromptBatch):
        caches = [[rolling(c) for c in make_prompt_cache(model)] for _ in prompts]
        batch = cls(model, [0, 1, 2], caches, prefill_step_size=4, samplers=[None] * 3,
                    logits_processors=[[] for _ in prompts])  # fmt: skip
        batch.prompt(prompts)
        keys = [c.keys for c in batch.prompt_cache]
        out.append((batch, batch.split(leaving), keys))
    (theirs_left, theirs, _), (ours_left, ours, keys) = out
    assert (ours.uids, ours_left.uids) == (theirs.uids, theirs_left.uids)
    for a, b in zip(theirs.prompt_cache, ours.prompt_cache, strict=True):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a.state, b.state, strict=True))
    moved = all(c.keys is k for c, k in zip(ours.prompt_cache, keys, strict=True))
    assert moved == (leaving == [0, 1, 2])
    assert len(ours_left.prompt_cache) == len(theirs_left.prompt_cache)
