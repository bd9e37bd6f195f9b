"""Speculation with the rest of the engine: the prefix store keeps exactly the emitted tokens of
a drafting row (one that stopped inside an accepted run too), n > 1 siblings draft, a cancelled
drafting row frees its place, seeded sampling repeats, and logprob figures stay the plain ones."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest, Speculation
from mlxd.engine.sampling import SamplingParams
from mlxd.store import PrefixStore

PROMPT = "Tell me a long story about a cat and a dog please, and then another one"


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(qwen3_tokenizer_dir)


@pytest.fixture(autouse=True)
def free_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify steps priced as plain ones: the gate drafts whenever a row has a draft, so what
    each step drafts does not depend on this machine's timings (the gate: test_spec_gate.py)."""
    from mlxd.engine.speculate.gate import StepCosts

    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, width: 1.0)


def _tokens(engine: Engine, req: GenerationRequest) -> tuple[list[Any], Any]:
    h = engine.submit(req)
    return list(h), h.done


def _req(prompt: list[int], n: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=n, **kw)


def test_the_store_keeps_a_drafting_rows_tokens_exactly(tiny_lm, qwen3_tokenizer) -> None:
    """Turn 1 drafts and stops inside an accepted run; turn 2 (its history plus more) hits the
    stored cache and gets the bits of an engine without a store."""
    model = tiny_lm("qwen3")
    prompt = qwen3_tokenizer.encode(PROMPT) * 3
    plain = Engine(model)
    try:
        want, _ = _tokens(plain, _req(prompt, 30))
        toks = [e.token for e in want]
        stop = toks[17]
        spec = Speculation("prediction", 8, toks)
        first = [e.token for e in _tokens(plain, _req(prompt, 30, stop_token_ids={stop}))[0]]
        turn2 = prompt + first + qwen3_tokenizer.encode(" and more")
        ref, _ = _tokens(plain, _req(turn2, 12))
    finally:
        plain.close()
    stored = Engine(model, prefix_store=PrefixStore(max_entries=20), namespace="t")
    try:
        events, done = _tokens(stored, _req(prompt, 30, stop_token_ids={stop}, speculation=spec))
        assert [e.token for e in events] == first and done.accepted_tokens > 0
        events, done = _tokens(stored, _req(turn2, 12))
        assert done.cached_tokens >= len(prompt) + len(first) - 1
        assert [e.token for e in events] == [e.token for e in ref]
        assert all(
            mx.array_equal(a.logprobs, b.logprobs).item() for a, b in zip(events, ref, strict=True)
        )
    finally:
        stored.close()


@pytest.fixture
def prompt(qwen3_tokenizer: Any) -> list[int]:
    return qwen3_tokenizer.encode(PROMPT)


@pytest.fixture
def engine(tiny_lm: Any) -> Iterator[Engine]:
    e = Engine(tiny_lm("qwen3"))
    yield e
    e.close()


def test_siblings_of_one_prompt_draft(engine: Engine, prompt: list[int]) -> None:
    want = [e.token for e in _tokens(engine, _req(prompt, 20))[0]]
    spec = Speculation("prediction", 4, want)
    handles = engine.submit_n(_req(prompt, 20, speculation=spec), 3)
    for h in handles:
        assert [e.token for e in h] == want
        assert h.done.accepted_tokens > 0


def test_cancelled_drafting_row_frees_its_place(engine: Engine, prompt: list[int]) -> None:
    want = [e.token for e in _tokens(engine, _req(prompt, 40))[0]]
    spec = Speculation("prediction", 4, want)
    a, b = engine.submit_many([_req(prompt, 40, speculation=spec), _req(prompt, 40)])
    it = iter(a)
    got = [next(it).token for _ in range(6)]
    a.cancel()
    list(it)
    assert a.done.reason == "cancelled" and got == want[:6]
    assert [e.token for e in b] == want
    assert [e.token for e in _tokens(engine, _req(prompt, 40, speculation=spec))[0]] == want
    assert engine.stats()["active"] == 0


def test_seeded_sampling_repeats_and_figures_match(engine: Engine, prompt: list[int]) -> None:
    """With a temperature, a seeded drafting row repeats itself; the logprob and top-logprob
    figures of every token (accepted drafts too) are read from that token's own vector."""
    params = SamplingParams(temp=0.8)
    kw = {"sampling": params, "seed": 7, "logprob": True, "top_logprobs": 3}
    greedy = [e.token for e in _tokens(engine, _req(prompt, 24))[0]]
    spec = Speculation("prediction", 4, greedy)
    runs = [_tokens(engine, _req(prompt, 24, speculation=spec, **kw))[0] for _ in range(2)]
    assert [e.token for e in runs[0]] == [e.token for e in runs[1]]
    for e in runs[0]:
        assert e.logprob == e.logprobs[e.token].item()
        top = sorted(e.logprobs.tolist(), reverse=True)[:3]
        assert sorted(v for _, v in e.top_logprobs) == sorted(top)
