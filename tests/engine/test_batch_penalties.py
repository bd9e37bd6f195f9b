"""Repetition, presence and frequency penalties over the batch (engine/decode_step.py):
the same logits as mlx-lm's processors on each one-row slice, and in the whole step the same
tokens and logprob arrays as BatchGenerator with mlx-lm's own processors."""

import random
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from mlx_lm.sample_utils import make_logits_processors

from mlxd.engine import decode_step
from mlxd.engine.sampling import SamplingParams


def _random_params(rng: random.Random) -> SamplingParams:
    pick = rng.choice
    return SamplingParams(
        logit_bias=pick([None, {3: 2.0, 40: -5.0}]),
        repetition_penalty=pick([None, None, 1.3, 0.8]),
        repetition_context_size=pick([4, 20]),
        presence_penalty=pick([None, 0.0, 0.7, -0.4]),
        presence_context_size=pick([3, 20]),
        frequency_penalty=pick([None, 0.5, 1.1]),
        frequency_context_size=pick([6, 20]),
    )


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("trial", range(8))
def test_penalties_over_the_batch_equal_each_rows_processors(dtype, trial: int) -> None:
    rng = random.Random(trial)
    B, V = rng.randint(1, 9), 64
    params = [_random_params(rng) for _ in range(B)]
    # Short, long and repetitive histories: duplicates exercise the scatter's order.
    history = [[rng.randrange(V // 4) for _ in range(rng.randint(1, 30))] for _ in range(B)]
    mx.random.seed(trial)
    logits = (mx.random.normal((B, V)) * 3).astype(dtype)
    rows = []
    for e, p in enumerate(params):
        row = logits[e : e + 1]
        for proc in make_logits_processors(
            None, p.repetition_penalty, p.repetition_context_size, p.presence_penalty,
            p.presence_context_size, p.frequency_penalty, p.frequency_context_size,
        ):  # fmt: skip
            row = proc(mx.array(history[e]), row)
        rows.append(row)
    expected = mx.concatenate(rows)
    procs = [[q for q in p.processors() if isinstance(q, decode_step.Penalty)] for p in params]
    contexts = {e: mx.array(h) for e, h in enumerate(history) if procs[e]}
    got = decode_step.apply_penalties(logits, procs, contexts)
    assert got.dtype == expected.dtype and mx.array_equal(got, expected).item()
    if any(procs):
        assert not mx.array_equal(got, logits).item()  # the penalties did something


def _load(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


def _generator_run(model, prompts, params, ours: bool):
    """BatchGenerator from one thread key; `ours`: mlxd's step and processors, else mlx-lm's."""
    mx.random.seed(5)
    if ours:
        procs = [p.processors() for p in params]
    else:
        procs = [
            make_logits_processors(
                p.logit_bias, p.repetition_penalty, p.repetition_context_size,
                p.presence_penalty, p.presence_context_size, p.frequency_penalty,
                p.frequency_context_size,
            )
            for p in params
        ]  # fmt: skip
    samplers = [p.sampler() for p in params]
    return batch_generator_outputs(
        model, prompts, 12, frozenset(), procs, samplers=samplers, mlxd_step=True if ours else None
    )


def test_the_step_with_penalised_sampled_rows_equals_batch_generator(
    tiny_model, monkeypatch
) -> None:
    model, tok = _load(tiny_model)
    texts = ["Tell me a story", "The sea is", "a a a a a a", "Hello", "x y z", "One two three"]
    prompts = [tok.encode(t) for t in texts]
    rng = random.Random(11)
    params = [_random_params(rng) for _ in texts]
    for e, p in enumerate(params):
        p.temp = [0.0, 0.8, 1.2][e % 3]
    params[0].repetition_penalty = 1.5  # at least one of each kind
    params[1].presence_penalty = 0.9
    params[2].frequency_penalty = 0.6
    calls: list[int] = []
    real = decode_step.apply_penalties
    monkeypatch.setattr(
        "mlxd.engine.decode_step.apply_penalties",
        lambda lg, ps, cx: calls.append(1) or real(lg, ps, cx),
    )
    expected = _generator_run(model, prompts, params, ours=False)
    got = _generator_run(model, prompts, params, ours=True)
    assert len(calls) >= 11  # every decode step after the prefill's first token
    for g, r in zip(got, expected, strict=True):
        assert [t for t, _ in g] == [t for t, _ in r]
        assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(g, r, strict=True))
