"""Batched rows with different samplers drawn in a few batched calls (engine/sampling.py):
each row's token, every seeded row's key and the thread's key afterwards equal mlx-lm's
per-row loop (GenerationBatch._step: a sampler call per one-row slice), bit for bit."""

import random
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlxd.config import EngineConfig
from mlxd.engine import sampling
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.rng import current_key, set_key
from mlxd.engine.sampling import KeyedSampler, LogitBias, SamplingParams, seed_key

MIX = [
    SamplingParams(temp=0.7, top_p=0.95),
    SamplingParams(),  # greedy between sampled rows
    SamplingParams(temp=0.7, top_p=0.95),  # equal to row 0: one group
    SamplingParams(temp=1.3),
    SamplingParams(temp=0.9, min_p=0.05, min_tokens_to_keep=3),
    SamplingParams(temp=0.6, top_k=20, top_p=0.8),
]


def _samplers(seeds: list[int | None]) -> list:
    """Each row's sampler as the engine builds it: its own object, keyed when seeded."""
    out = []
    for p, seed in zip(MIX, seeds, strict=True):
        s = p.sampler()
        out.append(s if seed is None else KeyedSampler(s, seed_key(seed), p.draws))
    return out


def _per_row(samplers: list, logprobs: mx.array) -> mx.array:
    return mx.concatenate([s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("vocab", [1000, 151936])
@pytest.mark.parametrize("seeds", [[None] * 6, [None, 11, None, None, 12, None]])
def test_batched_draws_equal_mlx_lms_per_row_loop(dtype, vocab: int, seeds: list) -> None:
    for step in range(4 if vocab < 10_000 else 1):
        mx.random.seed(100 + step)
        logits = (mx.random.normal((len(MIX), vocab)) * 4).astype(dtype)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        ref_samplers, got_samplers = _samplers(seeds), _samplers(seeds)
        set_key((7, step))
        ref = _per_row(ref_samplers, logprobs)
        ref_key = current_key()
        set_key((7, step))
        got = sampling.sample_rows(got_samplers, logprobs)
        assert got is not None and got.dtype == ref.dtype and got.shape == ref.shape
        assert got.tolist() == ref.tolist()
        assert current_key() == ref_key  # the next step's draws start from the same key
        keys = [(s.key if isinstance(s, KeyedSampler) else None) for s in got_samplers]
        assert keys == [(s.key if isinstance(s, KeyedSampler) else None) for s in ref_samplers]


def _random_params(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.25:
        return SamplingParams()  # greedy
    return SamplingParams(
        temp=rng.choice([0.3, 0.7, 1.0, 1.5]),
        top_p=rng.choice([0.0, 0.5, 0.9, 1.0]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.2]),
        min_tokens_to_keep=rng.choice([1, 1, 4]),
        top_k=rng.choice([0, 0, 5, 50]),
        xtc_probability=rng.choice([0.0, 0.0, 0.5, 1.0]),  # XTC draws a coin before the token
        xtc_threshold=rng.choice([0.01, 0.1]),
        xtc_special_tokens=rng.choice([[], [3, 7]]),
    )


@pytest.mark.parametrize("trial", range(16))
def test_random_mixes_of_rows_draw_as_the_per_row_loop(trial: int) -> None:
    """Random row counts, parameters (repeats included, so groups form) and seeds, 3 steps."""
    rng = random.Random(trial)
    B = rng.randint(2, 12)
    params = [_random_params(rng) for _ in range(B)]
    if rng.random() < 0.5:
        params = [rng.choice(params[:3]) for _ in range(B)]  # few distinct groups
    seeds = [rng.choice([None, None, rng.randrange(1 << 30)]) for _ in range(B)]

    def samplers() -> list:
        out = []
        for p, seed in zip(params, seeds, strict=True):
            s = p.sampler()
            out.append(s if seed is None else KeyedSampler(s, seed_key(seed), p.draws))
        return out

    ref_samplers, got_samplers = samplers(), samplers()
    for step in range(3):
        mx.random.seed(1000 * trial + step)
        logits = (mx.random.normal((B, 1000)) * rng.choice([1, 4, 12])).astype(mx.bfloat16)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        set_key((trial, step))
        ref = _per_row(ref_samplers, logprobs)
        ref_key = current_key()
        set_key((trial, step))
        got = sampling.sample_rows(got_samplers, logprobs)
        assert got is not None and got.tolist() == ref.tolist(), (trial, step)
        assert current_key() == ref_key
    keys = [getattr(s, "key", None) for s in got_samplers]
    assert keys == [getattr(s, "key", None) for s in ref_samplers]


def test_a_sampler_it_cannot_batch_leaves_the_step_to_mlx_lm() -> None:
    logprobs = mx.zeros((2, 16))
    assert (
        sampling.sample_rows([MIX[0].sampler(), make_sampler(0.7)], logprobs) is None
    )  # a callable


def _load(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


PROMPTS = ["Tell me a story", "The sea is", "One two three four", "Hello", "x y z", "A cat"]


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """One entry per batched draw the step takes (engine/decode_step.py's call)."""
    seen: list[int] = []
    real = sampling.sample_rows
    monkeypatch.setattr(
        "mlxd.engine.decode_step.sample_rows", lambda s, lp: seen.append(1) or real(s, lp)
    )
    return seen


def _engine_run(model, tok, on: bool | None) -> list[list[tuple[int, mx.array]]]:
    """Every row seeded: the engine thread's own key would make unseeded rows differ by run."""
    engine = Engine(model, config=EngineConfig(8, 8, 2048, batch_sampling=on))
    try:
        reqs = [
            GenerationRequest(
                prompt=mx.array(tok.encode(t)), max_tokens=10, sampling=p, seed=40 + e
            )
            for e, (t, p) in enumerate(zip(PROMPTS, MIX, strict=True))
        ]
        runs = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
        assert engine.paths == {"batched": len(MIX)}
        return runs
    finally:
        engine.close()


def _same(a, b) -> bool:
    return all(
        [t for t, _ in x] == [t for t, _ in y]
        and all(mx.array_equal(p, q).item() for (_, p), (_, q) in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def test_the_engine_samples_seeded_rows_as_the_per_row_loop(tiny_model, calls) -> None:
    model, tok = _load(tiny_model)
    batched = _engine_run(model, tok, True)
    assert calls  # the batched draw ran
    n = len(calls)
    assert _same(batched, _engine_run(model, tok, False))
    assert len(calls) == n  # and the per-row loop did not use it


def _generator_run(model, prompts: list[list[int]], on: bool | None, bias: dict | None = None):
    """BatchGenerator with each row's own sampler from one thread key; `on` swaps in mlxd's
    step (as BatchedRows does), with or without the batched draw; None: mlx-lm's own step.
    `bias`: every row's logit_bias, as mlxd's LogitBias or mlx-lm's own processor."""
    mx.random.seed(3)
    procs = None
    if bias:
        make = (lambda: [LogitBias(bias)]) if on else (lambda: make_logits_processors(bias))
        procs = [make() for _ in prompts]
    samplers = [p.sampler() for p in MIX]
    return batch_generator_outputs(
        model, prompts, 10, frozenset(), procs, samplers=samplers, mlxd_step=on
    )


def test_unseeded_rows_equal_batch_generator_with_per_row_samplers(tiny_model, calls) -> None:
    model, tok = _load(tiny_model)
    prompts = [tok.encode(t) for t in PROMPTS]
    expected = _generator_run(model, prompts, None)
    assert calls == []  # mlx-lm's own step
    assert _same(_generator_run(model, prompts, True), expected)
    assert len(calls) == 10  # every decode step after the prefill (the last one runs ahead)
    assert not _same(_generator_run(model, prompts[::-1], True)[::-1], expected)  # keys matter


def test_with_logit_biases_too(tiny_model) -> None:
    """The agent-fleet case: every row bans ids (one scatter) and samples with its own sampler."""
    model, tok = _load(tiny_model)
    prompts = [tok.encode(t) for t in PROMPTS]
    bias = {5: -100.0, 17: -100.0, 151645: -100.0}
    expected = _generator_run(model, prompts, None, bias)
    assert _same(_generator_run(model, prompts, True, bias), expected)
    assert not _same(_generator_run(model, prompts, True), expected)  # the biases applied


def test_an_engine_at_its_defaults_draws_batched_except_on_metal(tiny_model, calls) -> None:
    """The CPU and MLX-CUDA are where these tests proved the bits; Metal waits for its run."""
    model, tok = _load(tiny_model)
    _engine_run(model, tok, None)  # EngineConfig(batch_sampling=None): the default
    assert bool(calls) == (not mx.metal.is_available())
