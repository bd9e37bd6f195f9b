"""Grammar masks in the batched step: constrained and free rows share one
batch; the masks are filled on the CPU while the forward runs and applied with one `where`
(`decode_step.py`). mlx-lm's BatchGenerator running the same processors row by row (its own
per-row path) is the oracle: token ids and logprob arrays are equal."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs
from mlx_lm.sample_utils import make_logits_processors

from mlxd.constrain import Constraint, compiler_for
from mlxd.constrain.processor import GrammarLogitsProcessor
from mlxd.engine.decode_step import BiasedGenerationBatch, LogitBias
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest

TEXTS = ["Hello there my friend", "Tell me a long story about a cat", "x", "one two three four"]
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["n", "ok"],
    "additionalProperties": False,
}
# Per row: (constraint, logit bias). Row 1 is free, row 3 free with a bias.
ROWS = [
    (Constraint.json_schema(SCHEMA), {17: 5.0}),
    (None, None),
    (Constraint.regex(r"(yes|no)-[0-9]{1,3}"), None),
    (None, {42: 12.0}),
]


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each batched mask fill covered (the fast path was taken)."""
    seen: list[int] = []
    inner = BiasedGenerationBatch._masks

    def spy(self, inputs, grammars):
        seen.append(len(grammars))
        return inner(self, inputs, grammars)

    monkeypatch.setattr(BiasedGenerationBatch, "_masks", spy)
    return seen


def test_constrained_and_free_rows_share_a_batch_with_mlx_lm_s_bits(
    tiny_model: Callable[..., Path], masked: list[int]
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    compiler = compiler_for(tok)

    def grammar(c: Constraint | None) -> list:
        return [GrammarLogitsProcessor(compiler.matcher(c))] if c is not None else []

    oracle = [make_logits_processors(b) + grammar(c) for c, b in ROWS]
    ref = batch_generator_outputs(model, prompts, 40, eos, oracle)
    engine = Engine(model)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=40, stop_token_ids=eos,
                              logits_processors=([LogitBias(b)] if b else []) + grammar(c))
            for p, (c, b) in zip(prompts, ROWS, strict=True)
        ]  # fmt: skip
        got = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
    finally:
        engine.close()
    assert_same_outputs(got, ref)
    assert masked and max(masked) == len(TEXTS)  # all four rows in one masked step
    import json
    import re

    text = [tok.decode([t for t, _ in g if t not in eos]) for g in got]
    assert set(json.loads(text[0])) == {"n", "ok"}  # completed under the grammar
    assert re.fullmatch(r"(yes|no)-[0-9]{1,3}", text[2])


def test_n_siblings_each_follow_their_own_grammar(tiny_model: Callable[..., Path]) -> None:
    """n = 3 seeded siblings of one constrained prompt: sibling i equals generate_step seeded
    with seed + i under a fresh grammar processor (each sibling has its own matcher)."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxd.engine.sampling import SamplingParams

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    compiler = compiler_for(tok)
    regex = Constraint.regex(r"(yes|no)-[0-9]{1,3}")
    prompt = tok.encode(TEXTS[1])
    params = SamplingParams(temp=1.0, top_k=50)
    engine = Engine(model)
    try:
        req = GenerationRequest(
            prompt=mx.array(prompt), max_tokens=12, stop_token_ids=eos, sampling=params,
            seed=5, logits_processors=[GrammarLogitsProcessor(compiler.matcher(regex))],
        )  # fmt: skip
        outs = [[(e.token, e.logprobs) for e in h] for h in engine.submit_n(req, 3)]
    finally:
        engine.close()
    for i, out in enumerate(outs):
        mx.random.seed(5 + i)
        solo = generate_step(
            mx.array(prompt), model, max_tokens=12, sampler=params.sampler(),
            logits_processors=[GrammarLogitsProcessor(compiler.matcher(regex))],
        )  # fmt: skip
        want = list(solo)[: len(out)]  # the engine stops at EOS; generate_step goes on
        assert [t for t, _ in out] == [t for t, _ in want]
        assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(out, want, strict=True))
    assert len({tuple(t for t, _ in o) for o in outs}) > 1
