"""Logit biases in the batched step: one scatter over the batch (`decode_step.py`) gives
mlx-lm's BatchGenerator bits exactly, with mlx-lm's own per-row processors as the oracle."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs
from mlx_lm.sample_utils import make_logits_processors

from mlxd.config import EngineConfig
from mlxd.engine.decode_step import BiasedGenerationBatch
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams

TEXTS = ["Hello there my friend", "Tell me a long story about a cat", "x", "one two three four"]
# Strong enough to move greedy choices: rows with a bias take other tokens than without.
BIASES = [{17: 30.0, 923: 29.5, 5000: -100.0}, None, {42: 12.0}, {17: 3.0, 18: 3.0, 99: 11.0}]


def _oracle(model, prompts, n, eos, processors):
    return batch_generator_outputs(model, prompts, n, eos, processors)


def _run(model, prompts, n, eos, params: list[SamplingParams], config: EngineConfig | None = None):
    engine = Engine(model, config=config)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=n, stop_token_ids=eos, sampling=s)
            for p, s in zip(prompts, params, strict=True)
        ]
        return [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
    finally:
        engine.close()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the batched-bias steps (the one-scatter path taken)."""
    calls: list[int] = []
    inner = BiasedGenerationBatch._scatter

    def counting(self, procs):
        calls.append(len(procs))
        return inner(self, procs)

    monkeypatch.setattr(BiasedGenerationBatch, "_scatter", counting)
    return calls


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_biases_as_one_scatter_equal_mlx_lm_per_row(
    tiny_model: Callable[..., Path], arch: str, spy: list[int]
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model(arch)))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    ref = _oracle(model, prompts, 10, eos, [make_logits_processors(b) for b in BIASES])
    got = _run(model, prompts, 10, eos, [SamplingParams(logit_bias=b) for b in BIASES])
    assert_same_outputs(got, ref)
    assert spy and max(spy) == len(TEXTS)  # the whole batch went through the scatter
    unbiased = _oracle(model, prompts, 10, eos, [[] for _ in TEXTS])
    assert [t for t, _ in ref[0]] != [t for t, _ in unbiased[0]]  # the biases do change tokens


def test_a_row_with_a_penalty_shares_the_batched_step(
    tiny_model: Callable[..., Path], spy: list[int]
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    penalty = [dict(repetition_penalty=1.3) if i == 1 else {} for i in range(len(TEXTS))]
    ref = _oracle(
        model, prompts, 8, eos,
        [make_logits_processors(b, **p) for b, p in zip(BIASES, penalty, strict=True)],
    )  # fmt: skip
    params = [SamplingParams(logit_bias=b, **p) for b, p in zip(BIASES, penalty, strict=True)]
    assert_same_outputs(_run(model, prompts, 8, eos, params), ref)
    # The penalised row no longer sends the batch to mlx-lm's per-row step (decode_step.py).
    assert len(TEXTS) in spy


def test_rows_asking_for_logprobs_take_mlxd_step_with_batch_generator_bits(
    tiny_model: Callable[..., Path],
) -> None:
    """A row with logprob / top_logprobs moves a plain greedy batch onto mlxd's step (its
    figures are built in the step's graph): tokens and logprob arrays stay BatchGenerator's,
    and each figure is its vector's own entry."""
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    ref = _oracle(model, prompts, 8, eos, None)
    engine = Engine(model)
    try:
        reqs = [
            GenerationRequest(
                prompt=mx.array(p), max_tokens=8, stop_token_ids=eos,
                logprob=i % 2 == 0, top_logprobs=3 if i < 2 else 0,
            )
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        events = [list(h) for h in engine.submit_many(reqs)]
    finally:
        engine.close()
    assert_same_outputs([[(e.token, e.logprobs) for e in row] for row in events], ref)
    for req, row in zip(reqs, events, strict=True):
        for e in row:
            vector = e.logprobs.tolist()
            assert (e.logprob == vector[e.token]) if req.logprob else e.logprob is None
            tops = e.top_logprobs or []
            assert len(tops) == req.top_logprobs and all(lp == vector[i] for i, lp in tops)


def test_a_rows_processors_sort_into_bias_penalties_grammar_or_none() -> None:
    """`_kinds` runs for every row each step the batch's own path is taken: a row without
    processors is the usual case, and anything unknown must send the batch to mlx-lm's step."""
    from mlxd.constrain.processor import GrammarLogitsProcessor
    from mlxd.engine.decode_step import _kinds
    from mlxd.engine.sampling import LogitBias, Penalty

    assert _kinds(None) == (None, [], None) and _kinds([]) == (None, [], None)
    bias = LogitBias({3: 1.0})
    pen = Penalty("repetition", 1.1, 20, lambda tokens, logits: logits)
    grammar = GrammarLogitsProcessor.__new__(GrammarLogitsProcessor)  # only its type matters
    assert _kinds([bias, pen, grammar]) == (bias, [pen], grammar)
    assert _kinds([pen]) == (None, [pen], None)
    assert _kinds([bias, lambda tokens, logits: logits]) is None  # a caller's own callable
    assert _kinds([grammar, bias]) is None  # not mlx-lm's order


def _own_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each step mlxd's own step lines ran (not mlx-lm's `_step`)."""
    steps: list[int] = []
    inner = BiasedGenerationBatch._readouts

    def counting(self, sampled, logprobs):
        steps.append(len(self.uids))
        return inner(self, sampled, logprobs)

    monkeypatch.setattr(BiasedGenerationBatch, "_readouts", counting)
    return steps


def test_the_default_order_is_mlx_lms_own_step(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a step order (nor a processor), mlx-lm's GenerationBatch._step runs as it is:
    the order is the engine's config, not a class default."""
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    prompts = [tok.encode(t) for t in TEXTS[:2]]
    steps = _own_steps(monkeypatch)
    got = _run(model, prompts, 6, frozenset(tok.eos_token_ids), [SamplingParams()] * 2)
    assert [len(h) for h in got] == [6, 6] and steps == []


def test_step_order_and_thread_rows_settings() -> None:
    from mlx_lm.models.cache import KVCache

    from mlxd.config import EngineConfig, from_env
    from mlxd.engine import overlap

    assert overlap.default_order() == ("thread" if mx.cuda.is_available() else "pipelined")
    with pytest.raises(ValueError, match="one of pipelined, thread"):
        EngineConfig(step_order="split")
    assert from_env(EngineConfig(), {}).thread_rows == 16
    assert from_env(EngineConfig(), {"MLXD_THREAD_ROWS": "24"}).thread_rows == 24
    assert from_env(EngineConfig(thread_rows=3), {"MLXD_THREAD_ROWS": "24"}).thread_rows == 3
    for bad in ("0", "-3", "1.5"):
        with pytest.raises(ValueError, match="MLXD_THREAD_ROWS|a row count"):
            from_env(EngineConfig(), {"MLXD_THREAD_ROWS": bad})
    caches = [KVCache() for _ in range(6)]
    for c in caches:
        c.update_and_fetch(mx.zeros((1, 1, 2, 4)), mx.ones((1, 1, 2, 4)))
    got = overlap.first_layers(caches, 0.25)  # ceil(1.5) = 2 layers
    assert len(got) == 4 and got[0] is caches[0].keys and got[3] is caches[1].values
    assert len(overlap.first_layers(caches, 0.01)) == 2  # at least one layer
    assert len(overlap.first_layers(caches, 2.0)) == 12  # at most all
