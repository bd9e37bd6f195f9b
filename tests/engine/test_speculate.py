"""Speculation in the batched step: greedy output token for token what the engine gives without
it, whether drafts are all accepted, partly, or not at all, rows accepting different counts in
one step (the ragged roll-back), rows that draft beside rows that do not, stop and length inside
an accepted run, and the drafted / accepted counts on the final event."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest, Speculation

TEXTS = ["Hello there my friend", "Tell me a long story about a cat and a dog please", "x y z"]


@pytest.fixture(autouse=True)
def free_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify steps priced as plain ones: the gate drafts whenever a row has a draft, so what
    each step drafts does not depend on this machine's timings (the gate: test_spec_gate.py)."""
    from mlxd.engine.speculate.gate import StepCosts

    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, width: 1.0)


def _load(tiny_model: Callable[..., Path], arch: str):
    from mlx_lm import load

    return load(str(tiny_model(arch)))


def _req(prompt: list[int], n: int, spec: Speculation | None = None, **kw) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=n, speculation=spec, **kw)


def _run(model, reqs: list[GenerationRequest], **settings) -> list[tuple[list[int], list, object]]:
    engine = Engine(model, **settings)
    try:
        handles = engine.submit_many(reqs)
        out = []
        for h in handles:
            events = list(h)
            out.append(([e.token for e in events], [e.logprobs for e in events], h.done))
        return out
    finally:
        engine.close()


def _same_logprobs(a: list[mx.array], b: list[mx.array]) -> bool:
    return all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_predicted_output_is_token_identical_and_accepted(tiny_model, arch: str) -> None:
    """A prediction equal to the plain output: every draft accepted, the same tokens."""
    model, tok = _load(tiny_model, arch)
    prompts = [tok.encode(t) for t in TEXTS]
    plain = _run(model, [_req(p, 24) for p in prompts])
    spec = [Speculation("prediction", 5, toks) for toks, _, _ in plain]
    got = _run(model, [_req(p, 24, s) for p, s in zip(prompts, spec, strict=True)])
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert _same_logprobs(lps, wlp)
        assert done.drafted_tokens > 0
        assert done.accepted_tokens == done.drafted_tokens


@pytest.mark.parametrize("order", ["pipelined", "thread"])
def test_ragged_acceptance_keeps_every_row_exact(tiny_model, order: str) -> None:
    """Rows whose predictions go wrong at different places: each row keeps its own accepted
    run, the caches are rolled back per row, and the tokens stay the plain ones (with the
    step's encoder thread too, CUDA's default order)."""
    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    plain = _run(model, [_req(p, 30) for p in prompts], step_order=order)
    specs = []
    for r, (toks, _, _) in enumerate(plain):
        wrong = list(toks)
        for j in range(3 + 2 * r, len(wrong), 7 + r):
            wrong[j] = (wrong[j] + 1) % 1000  # a different token every few places
        specs.append(Speculation("prediction", 6, wrong))
    reqs = [_req(p, 30, s) for p, s in zip(prompts, specs, strict=True)]
    got = _run(model, reqs, step_order=order)
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert _same_logprobs(lps, wlp)
        assert 0 < done.accepted_tokens < done.drafted_tokens


def test_drafting_rows_beside_plain_rows_and_prompt_lookup(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    plain = _run(model, [_req(p, 40) for p in prompts])
    specs = [Speculation("ngram", 4), None, Speculation("prediction", 3, plain[2][0])]
    got = _run(model, [_req(p, 40, s) for p, s in zip(prompts, specs, strict=True)])
    for (want, _, _), (toks, _, _) in zip(plain, got, strict=True):
        assert toks == want
    assert got[1][2].drafted_tokens == 0
    assert got[2][2].accepted_tokens > 0


def test_stop_token_inside_an_accepted_run_ends_there(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompt = tok.encode(TEXTS[1])
    ((want, _, _),) = _run(model, [_req(prompt, 20)])
    stop = want[7]
    cut = want[: want.index(stop) + 1]
    spec = Speculation("prediction", 8, want)
    ((toks, _, done),) = _run(model, [_req(prompt, 20, spec, stop_token_ids=frozenset({stop}))])
    assert toks == cut
    assert done.reason == "stop"
    ((toks, _, done),) = _run(model, [_req(prompt, 5, spec)])
    assert toks == want[:5] and done.reason == "length"


def test_quantized_kv_rows_draft_and_keep_their_tokens(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    kv = {"kv_bits": 8, "quantized_kv_start": 0}
    plain = _run(model, [_req(p, 20, **kv) for p in prompts])
    specs = [Speculation("prediction", 4, toks[:9] + [1] + toks[10:]) for toks, _, _ in plain]
    got = _run(model, [_req(p, 20, s, **kv) for p, s in zip(prompts, specs, strict=True)])
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert _same_logprobs(lps, wlp)
        assert done.accepted_tokens > 0


def test_recurrent_caches_refuse_speculation_with_the_reason(tiny_model) -> None:
    model, tok = _load(tiny_model, "lfm2")
    engine = Engine(model)
    try:
        with pytest.raises(ValueError, match="cut back.*ArraysCache"):
            engine.submit(_req(tok.encode("hi"), 4, Speculation("ngram", 4)))
        with pytest.raises(ValueError, match="batched step.*max_kv_size"):
            model2, tok2 = _load(tiny_model, "qwen3")
            Engine(model2).submit(
                _req(tok2.encode("hi"), 4, Speculation("ngram", 4), max_kv_size=64)
            )
        assert len(list(engine.submit(_req(tok.encode("hi"), 4)))) == 4  # it still serves
    finally:
        engine.close()


def test_sliding_window_rows_draft_past_their_window(tiny_model) -> None:
    """gemma3's sliding layers (a 16-token window here) wrap many times over 60 tokens: rows
    accepting different counts keep the plain tokens, and logprobs to float32 rounding."""
    model, tok = _load(tiny_model, "gemma3")
    prompts = [tok.encode(t) for t in TEXTS]
    plain = _run(model, [_req(p, 60) for p in prompts])
    specs = []
    for r, (toks, _, _) in enumerate(plain):
        wrong = list(toks)
        for j in range(5 + r, len(wrong), 9 + 2 * r):
            wrong[j] = (wrong[j] + 1) % 1000
        specs.append(Speculation("prediction", 5, wrong))
    got = _run(model, [_req(p, 60, s) for p, s in zip(prompts, specs, strict=True)])
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        # a verify step attends its window over the ring's longer, masked multi-token buffer:
        # float32 sums in another order (~1e-5), never another token
        assert all(mx.allclose(a, b, atol=1e-4).item() for a, b in zip(lps, wlp, strict=True))
        assert 0 < done.accepted_tokens < done.drafted_tokens


def test_logit_bias_rows_draft_with_the_bias_at_every_position(tiny_model) -> None:
    """A logit bias is the same at every position: biased rows draft, and their tokens and
    logprobs equal the plain biased step's (a penalty row beside them does not draft)."""
    from mlxd.engine.sampling import SamplingParams

    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    plain_out = _run(model, [_req(p, 24) for p in prompts])
    bias = {t: -100.0 for t in plain_out[0][0][3:6]} | {7: 5.0}

    def sampling(r: int) -> SamplingParams:
        if r == 2:
            return SamplingParams(repetition_penalty=1.3)
        return SamplingParams(logit_bias=bias)

    plain = _run(model, [_req(p, 24, sampling=sampling(r)) for r, p in enumerate(prompts)])
    specs = [Speculation("prediction", 5, toks[:12] + [9] + toks[13:]) for toks, _, _ in plain]
    reqs = [
        _req(p, 24, s, sampling=sampling(r))
        for r, (p, s) in enumerate(zip(prompts, specs, strict=True))
    ]
    got = _run(model, reqs)
    for (want, wlp, _), (toks, lps, _) in zip(plain, got, strict=True):
        assert toks == want
        assert _same_logprobs(lps, wlp)
    assert all(g[2].accepted_tokens > 0 for g in got)


def test_grammar_and_penalty_rows_draft_with_each_positions_history(tiny_model) -> None:
    """A grammar row's drafts are masked position by position (a forbidden draft is never
    accepted) and its matcher ends where its output does; a penalty row's later positions see
    the drafts before them. Tokens and logprobs equal the plain step's."""
    from mlxd.constrain import Constraint, compiler_for
    from mlxd.constrain.processor import GrammarLogitsProcessor
    from mlxd.engine.sampling import SamplingParams

    model, tok = _load(tiny_model, "qwen3")
    eos = frozenset(tok.eos_token_ids)
    compiler = compiler_for(tok)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
              "required": ["n", "s"], "additionalProperties": False}  # fmt: skip
    prompts = [tok.encode(t) for t in TEXTS]

    def reqs(specs):
        out = []
        for r, p in enumerate(prompts):
            kw = {"stop_token_ids": eos, "spec": specs[r] if specs else None}
            if r == 1:
                kw["sampling"] = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5)
            else:
                m = compiler.matcher(Constraint.json_schema(schema))
                kw["logits_processors"] = [GrammarLogitsProcessor(m)]
            out.append(_req(p, 40, **kw))
        return out

    plain = _run(model, reqs(None))
    specs = []
    for toks, _, _ in plain:
        wrong = list(toks)
        wrong[4] = tok.encode("}")[0]  # a draft the grammar forbids there (or just a wrong one)
        specs.append(Speculation("prediction", 6, wrong))
    got = _run(model, reqs(specs))
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert _same_logprobs(lps, wlp)
        assert done.accepted_tokens > 0
    assert sum(g[2].accepted_tokens for g in got) < sum(g[2].drafted_tokens for g in got)


def test_a_stop_sequence_inside_an_accepted_run_ends_there(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompt = tok.encode(TEXTS[1])
    ((want, _, _),) = _run(model, [_req(prompt, 24)])
    seq = want[8:10]
    end = next(i for i in range(1, len(want)) if want[i - 1 : i + 1] == seq) + 1
    spec = Speculation("prediction", 8, want)
    ((toks, _, done),) = _run(model, [_req(prompt, 24, spec, stop_sequences=[seq])])
    assert toks == want[:end] and done.reason == "stop"
    assert done.accepted_tokens > 0
