"""`n` > 1: rows sampled from one prompt that is prefilled once."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxd.engine import Engine, GenerationRequest, SamplingParams

TEXT = "Tell me a very long story about a cat and a dog please, with many details"


class CountingModel:
    """Delegates to the model and counts the prompt tokens it is fed (calls with L > 1)."""

    def __init__(self, model: Any) -> None:
        self.model, self.prefill_tokens = model, 0

    def __call__(self, inputs: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if inputs.shape[-1] > 1:
            self.prefill_tokens += inputs.size
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def loaded(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


def _req(prompt: list[int], **kw) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=10, prefill_step_size=4, **kw)


def test_prompt_is_prefilled_once_and_greedy_siblings_agree(loaded) -> None:
    model, tok = loaded
    prompt = tok.encode(TEXT)
    counting = CountingModel(model)
    engine = Engine(counting)
    try:
        handles = engine.submit_n(_req(prompt), 3)
        outs = [[e.token for e in h] for h in handles]
        assert counting.prefill_tokens == len(prompt) - 1  # not 3 x
        assert outs[0] == outs[1] == outs[2]
        assert outs[0] == [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=10)]
        assert engine.paths == {"forked": 3}
    finally:
        engine.close()


def test_seeded_siblings_differ_and_repeat(loaded) -> None:
    model, tok = loaded
    prompt = tok.encode(TEXT)
    params = SamplingParams(temp=1.0, top_k=50)
    engine = Engine(model)
    try:
        runs = []
        for _ in range(2):
            handles = engine.submit_n(_req(prompt, sampling=params, seed=3), 3)
            runs.append([[e.token for e in h] for h in handles])
        assert runs[0] == runs[1]
        assert len({tuple(o) for o in runs[0]}) == 3  # each choice has its own stream
    finally:
        engine.close()


@pytest.mark.parametrize("victim", [0, 1])
def test_cancel_a_sibling_while_queued_or_prefilling(loaded, victim: int) -> None:
    model, tok = loaded
    engine = Engine(model, batch=3)
    try:
        blocker = engine.submit(_req(tok.encode(TEXT)))  # holds a slot: the group waits
        handles = engine.submit_n(_req(tok.encode(TEXT * 4)), 3)
        handles[victim].cancel()
        list(blocker)
        assert handles[victim].wait().reason == "cancelled"
        others = [h for i, h in enumerate(handles) if i != victim]
        assert [len(list(h)) for h in others] == [10, 10]
        assert engine.stats()["active"] == 0
    finally:
        engine.close()


def test_n_needs_the_batched_step(loaded) -> None:
    model, tok = loaded
    engine = Engine(model)
    try:
        with pytest.raises(ValueError, match="n > 1 needs the batched step"):
            engine.submit_n(_req(tok.encode(TEXT), max_kv_size=8), 2)
    finally:
        engine.close()


@pytest.mark.parametrize("start", [6, 30])
def test_seeded_siblings_with_quantized_kv_equal_their_solo_runs(loaded, start: int) -> None:
    """n = 3 with --kv-bits: the prompt is prefilled once (converted in its prefill, start 6,
    or while decoding, start 30) and choice i equals generate_step seeded with seed + i."""
    model, tok = loaded
    prompt = tok.encode(TEXT)
    kv = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=start)
    params = SamplingParams(temp=1.0, top_k=50)
    engine = Engine(model)
    try:
        handles = engine.submit_n(_req(prompt, sampling=params, seed=5, **kv), 3)
        outs = [[(e.token, e.logprobs) for e in h] for h in handles]
        for i, out in enumerate(outs):
            mx.random.seed(5 + i)
            solo = generate_step(
                mx.array(prompt), model, max_tokens=10, prefill_step_size=4,
                sampler=params.sampler(), **kv,
            )  # fmt: skip
            want = list(solo)
            assert [t for t, _ in out] == [t for t, _ in want]
            assert all(
                mx.array_equal(a, b).item() for (_, a), (_, b) in zip(out, want, strict=True)
            )
    finally:
        engine.close()
