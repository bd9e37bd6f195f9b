"""Draft-model speculation in the batched step (speculate/draft_model.py): greedy output token
for token what the engine gives without it, with a draft that agrees (the target itself, loaded
apart: every draft kept) and one that mostly does not (another seed); rows that join, leave and
catch up at different times; rows beside plain rows; and the refusals."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest, Speculation

TEXTS = ["Hello there my friend", "Tell me a long story about a cat and a dog please", "x y z"]


@pytest.fixture(autouse=True)
def free_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify steps priced as plain ones, and draft-model rows that always offer: every step
    verifies, so what is checked does not depend on this machine's timings."""
    from mlxd.engine.speculate.gate import StepCosts

    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, width: 1.0)


def _load(tiny_model: Callable[..., Path], arch: str, seed: int | None = None):
    from mlx_lm import load

    return load(str(tiny_model(arch) if seed is None else tiny_model(arch, seed=seed)))


@pytest.fixture(scope="module")
def lm(tiny_model: Callable[..., Path]) -> Callable[..., tuple]:
    """`lm(arch, seed=None, copy=0)`: (model, tokenizer) loaded once for the module (a load
    costs about a second); copies 0 and 1 are the same weights loaded apart."""
    cache: dict[tuple, tuple] = {}

    def get(arch: str, seed: int | None = None, copy: int = 0) -> tuple:
        if (arch, seed, copy) not in cache:
            cache[arch, seed, copy] = _load(tiny_model, arch, seed)
        return cache[arch, seed, copy]

    return get


def _req(prompt: list[int], n: int, spec: Speculation | None = None, **kw) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=n, speculation=spec, **kw)


def _run(
    model, reqs, draft=None, stagger: bool = False, **settings
) -> list[tuple[list[int], list, object]]:
    """Each request's tokens, logprobs and final event; `stagger`: one request at a time
    joins after the previous one has emitted a few tokens."""
    engine = Engine(model, draft_model=draft, **settings)
    try:
        handles = []
        for r in reqs:
            handles.append(engine.submit(r))
            if stagger:
                it = iter(handles[-1])
                handles[-1] = (handles[-1], [next(it), next(it)], it)
        out = []
        for h in handles:
            head, it = ([], h) if not stagger else (h[1], h[2])
            events = head + list(it)
            done = (h if not stagger else h[0]).done
            out.append(([e.token for e in events], [e.logprobs for e in events], done))
        return out
    finally:
        engine.close()


def _model_spec(k: int = 4) -> Speculation:
    return Speculation(mode="model", max_draft=k)


@pytest.mark.parametrize(("arch", "order"), [("qwen3", "pipelined"), ("llama", "thread")])
def test_a_draft_that_agrees_is_always_accepted_and_changes_nothing(lm, arch, order):
    """(With the step's encoder thread too, CUDA's default step order.)"""
    model, tok = lm(arch)
    draft, _ = lm(arch, copy=1)  # the same weights, loaded apart
    prompts = [tok.encode(t) for t in TEXTS]
    plain = _run(model, [_req(p, 24) for p in prompts], step_order=order)
    reqs = [_req(p, 24, _model_spec()) for p in prompts]
    got = _run(model, reqs, draft=draft, step_order=order)
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert all(mx.array_equal(a, b).item() for a, b in zip(lps, wlp, strict=True))
        assert done.drafted_tokens > 0
        assert done.accepted_tokens == done.drafted_tokens


def test_a_draft_that_disagrees_keeps_the_targets_tokens(lm) -> None:
    model, tok = lm("qwen3")
    draft, _ = lm("qwen3", seed=1)
    prompts = [tok.encode(t) for t in TEXTS]
    # 16 tokens: a few verify steps a row, each with its drafts mostly rejected
    plain = _run(model, [_req(p, 16) for p in prompts])
    got = _run(model, [_req(p, 16, _model_spec(3)) for p in prompts], draft=draft)
    for (want, _, _), (toks, _, done) in zip(plain, got, strict=True):
        assert toks == want
        assert done.drafted_tokens > done.accepted_tokens


def test_grammar_and_penalty_rows_read_the_drafts_at_each_position(lm) -> None:
    """A penalty row's later positions see the model's drafts before them, a grammar row's
    drafts are checked against its masks: the plain step's tokens and logprobs."""
    from mlxd.constrain import Constraint, compiler_for
    from mlxd.constrain.processor import GrammarLogitsProcessor
    from mlxd.engine.sampling import SamplingParams

    model, tok = lm("qwen3")
    draft, _ = lm("qwen3", copy=1)
    compiler = compiler_for(tok)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def reqs(spec):
        pen = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5)
        grammar = [GrammarLogitsProcessor(compiler.matcher(Constraint.json_schema(schema)))]
        return [_req(tok.encode(TEXTS[0]), 30, spec, sampling=pen),
                _req(tok.encode(TEXTS[1]), 30, spec, logits_processors=grammar,
                     stop_token_ids=frozenset(tok.eos_token_ids))]  # fmt: skip

    plain = _run(model, reqs(None))
    got = _run(model, reqs(_model_spec(4)), draft=draft)
    for (want, wlp, _), (toks, lps, done) in zip(plain, got, strict=True):
        assert toks == want
        assert all(mx.array_equal(a, b).item() for a, b in zip(lps, wlp, strict=True))
        assert done.accepted_tokens > 0


def test_rows_join_and_leave_beside_plain_rows(lm) -> None:
    """Rows join one after another (each prefilled into the draft's batch cache), end at
    different lengths (filtered out of it), and a plain row runs beside them."""
    model, tok = lm("llama")
    draft, _ = lm("llama", copy=1)
    prompts = [tok.encode(t) for t in [*TEXTS, "one more prompt that is plain"]]
    lengths = [12, 30, 20, 25]
    plain = _run(model, [_req(p, n) for p, n in zip(prompts, lengths, strict=True)])
    specs = [_model_spec(3), _model_spec(5), _model_spec(2), None]
    reqs = [_req(p, n, s) for p, n, s in zip(prompts, lengths, specs, strict=True)]
    got = _run(model, reqs, draft=draft, stagger=True)
    for (want, _, _), (toks, _, done), spec in zip(plain, got, specs, strict=True):
        assert toks == want
        assert (done.drafted_tokens > 0) == (spec is not None)


def test_without_a_draft_model_the_request_is_refused(lm) -> None:
    model, tok = lm("llama")
    engine = Engine(model)
    try:
        with pytest.raises(ValueError, match="no draft model"):
            engine.submit(_req(tok.encode("hi"), 4, _model_spec()))
    finally:
        engine.close()


def test_a_sliding_window_draft_is_refused_with_the_reason(lm) -> None:
    model, tok = lm("qwen3")
    draft, _ = lm("gemma3")
    engine = Engine(model, draft_model=draft)
    try:
        with pytest.raises(ValueError, match="RotatingKVCache"):
            engine.submit(_req(tok.encode("hi"), 4, _model_spec()))
    finally:
        engine.close()


def test_a_draft_with_a_larger_vocabulary_is_refused(lm, tiny_model) -> None:
    """Its greedy ids could fall outside the model's embedding."""
    from mlxd.engine.speculate.draft_model import draft_refusal

    model, _ = lm("llama")
    draft, _ = _load(tiny_model, "llama")  # its own: changed below
    assert draft_refusal(draft, model) is None
    draft.args.vocab_size = model.args.vocab_size + 64
    assert "vocabulary" in (draft_refusal(draft, model) or "")


@pytest.mark.parametrize("drains", [True, False], ids=["cpu-drain", "cuda-no-drain"])
def test_a_lone_row_whose_drafts_do_not_pay_takes_the_serial_step(lm, monkeypatch, drains):
    """Priced out (a verify step costs eight plain ones), the lone drafting row stops
    drafting, and after GIVE_UP plain steps leaves its batch for the serial step: the same
    greedy tokens as without speculation. Also where a plain batch's last row stays batched
    (MLX-CUDA keeps mlx-lm's bits that way: moves.drain_keeps_bits)."""
    from mlxd.engine import engine as engine_module
    from mlxd.engine.speculate import drafting
    from mlxd.engine.speculate.gate import StepCosts

    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, width: 8.0)
    monkeypatch.setattr(engine_module, "drain_keeps_bits", lambda attention: drains)
    model, tok = lm("llama")
    draft, _ = lm("llama", copy=1)
    prompt = tok.encode(TEXTS[1])
    n = drafting.GIVE_UP + 20
    ((want, _, _),) = _run(model, [_req(prompt, n)])
    engine = Engine(model, draft_model=draft)
    try:
        h = engine.submit(_req(prompt, n, _model_spec()))
        assert [e.token for e in h] == want
        assert engine.paths["batched->serial"] == 1
    finally:
        engine.close()
