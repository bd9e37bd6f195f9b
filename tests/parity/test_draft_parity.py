"""Speculative decoding with a draft model: mlxd's engine (engine/draft_row.py) against mlx-lm's
speculative_generate_step, through both stream_generate functions, on tiny real architectures.

Each side loads the target and the draft with its own loader, re-seeds the PRNG right before
the call, and must produce the same responses: token ids, from_draft flags, texts, counters,
every logprob array bit for bit, the same exception, and the same PRNG key afterwards. A draft
that is the target itself (loaded separately) accepts every greedy draft; one of another seed
rejects most; sampling mixes both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from parity.helpers import PROMPT_TEXT, assert_bitwise_equal, assert_same_run, run_stream

import mlxd
from mlxd.engine import Engine
from mlxd.engine.api import engine_for
from mlxd.engine.request import GenerationRequest, Speculation

ARCHS = ("llama", "qwen3", "gemma3")
SHORT, LONG = 5, 40


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> Callable[[str, str], tuple[Any, ...]]:
    """`models(arch, draft)`: (ref target, ref tokenizer, ref draft, got target, got tokenizer,
    got draft); `draft` "self" is the target's folder, "other" a model of another seed."""
    cache: dict[tuple[str, str], tuple[Any, ...]] = {}

    def get(arch: str, draft: str) -> tuple[Any, ...]:
        if (arch, draft) not in cache:
            folder = str(tiny_model(arch))
            draft_folder = folder if draft == "self" else str(tiny_model(arch, seed=1))
            ref, ref_tok = mlx_lm.load(folder)
            got, got_tok = mlxd.load(folder)
            cache[arch, draft] = (
                ref, ref_tok, mlx_lm.load(draft_folder)[0],
                got, got_tok, mlxd.load(draft_folder)[0],
            )  # fmt: skip
        return cache[arch, draft]

    return get


def prompt(tok: Any, n: int) -> list[int]:
    return list(tok.encode(PROMPT_TEXT))[:n]


def both(get: Any, arch: str, draft: str, n_prompt: int, seed: int | None, **kw: Any) -> Any:
    """Run mlx-lm's and mlxd's stream_generate with a draft model; assert the same run."""
    ref, ref_tok, ref_draft, got, got_tok, got_draft = get(arch, draft)

    def fresh() -> dict[str, Any]:  # new sampler / processor objects for each side
        out = dict(kw)
        if "temp" in out:
            out["sampler"] = make_sampler(out.pop("temp"), top_p=out.pop("top_p", 0.0))
        if "penalty" in out:
            out["logits_processors"] = make_logits_processors(repetition_penalty=out.pop("penalty"))
        return out

    p = prompt(ref_tok, n_prompt)
    a = run_stream(mlx_lm.stream_generate, ref, ref_tok, p, seed=seed, draft_model=ref_draft,
                   **fresh())  # fmt: skip
    paths = engine_for(got).paths
    before = paths["draft model"]
    b = run_stream(mlxd.stream_generate, got, got_tok, p, seed=seed, draft_model=got_draft,
                   **fresh())  # fmt: skip
    assert paths["draft model"] == before + 1  # it ran on the engine, as a DraftRow
    assert_same_run(a, b, f"{arch}/{draft}")
    return b


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_self_draft_accepts(models: Any, arch: str) -> None:
    run = both(models, arch, "self", LONG, None, max_tokens=10, num_draft_tokens=3,
               prefill_step_size=16)  # fmt: skip
    assert run.error is None and len(run.fields) == 10
    assert sum(f["from_draft"] for f in run.fields) >= 6  # a draft equal to the target


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_other_draft(models: Any, arch: str) -> None:
    run = both(models, arch, "other", SHORT, None, max_tokens=9, num_draft_tokens=2)
    assert run.error is None and not all(f["from_draft"] for f in run.fields[:-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_seeded_sampling_with_processors(models: Any, arch: str) -> None:
    run = both(models, arch, "self", SHORT, 7, max_tokens=10, num_draft_tokens=3, temp=1.0,
               penalty=1.3)  # fmt: skip
    assert run.error is None


@pytest.mark.parametrize("arch", ARCHS)
def test_seeded_sampling(models: Any, arch: str) -> None:
    run = both(models, arch, "self", SHORT, 3, max_tokens=8, temp=0.8, top_p=0.9)
    flags = [f["from_draft"] for f in run.fields]
    assert run.error is None and len(flags) == 8


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_bits(models: Any, arch: str) -> None:
    """Quantized KV from the 12th token on (gemma3's rotating layers: mlx-lm's NYI, raised
    by both sides after the same responses)."""
    run = both(models, arch, "self", LONG, None, max_tokens=8, num_draft_tokens=2, kv_bits=4,
               kv_group_size=32, quantized_kv_start=12, prefill_step_size=16)  # fmt: skip
    assert (run.error is None) == (arch != "gemma3")


def test_untrimmable_cache_raises_mlx_lms_error(tiny_model: Callable[..., Path]) -> None:
    """lfm2's conv layers (ArraysCache) cannot be trimmed: the same ValueError either way."""
    folder = str(tiny_model("lfm2"))
    ref, ref_tok = mlx_lm.load(folder)
    got, got_tok = mlxd.load(folder)
    p = prompt(ref_tok, SHORT)
    a = run_stream(mlx_lm.stream_generate, ref, ref_tok, p, seed=None, draft_model=ref)
    b = run_stream(mlxd.stream_generate, got, got_tok, p, seed=None, draft_model=got)
    assert a.error is not None and a.error[0] is ValueError
    assert "trimmable" in a.error[1]
    assert_same_run(a, b, "lfm2")


def test_engine_request_against_speculative_generate_step(models: Any) -> None:
    """An engine request with Speculation(mode="draft"): the generator's tokens, logprobs and
    flags, the draft counts, and the returned prompt cache rewound as mlx-lm's `finally`."""
    ref, ref_tok, ref_draft, got, _, got_draft = models("qwen3", "self")
    p = mx.array(prompt(ref_tok, LONG))
    ref_cache = make_prompt_cache(ref) + make_prompt_cache(ref_draft)
    want = []
    for tok, lp, fd in speculative_generate_step(p, ref, ref_draft, num_draft_tokens=4,
                                                 max_tokens=7, prompt_cache=ref_cache):  # fmt: skip
        want.append((int(tok), lp, fd))
    engine = Engine(got, draft_model=got_draft)
    try:
        req = GenerationRequest(prompt=p, max_tokens=7, prefill_step_size=512,
                                speculation=Speculation(mode="draft", max_draft=4),
                                return_prompt_cache=True)  # fmt: skip
        handle = engine.submit(req)
        events = list(handle)
    finally:
        engine.close()
    assert [(e.token, e.from_draft) for e in events] == [(t, f) for t, _, f in want]
    for e, (_, lp, _) in zip(events, want, strict=True):
        assert mx.array_equal(e.logprobs, lp)
    done = handle.done
    assert done.accepted_tokens == sum(f for _, _, f in want)
    assert done.drafted_tokens >= done.accepted_tokens > 0
    assert [c.offset for c in done.prompt_cache] == [c.offset for c in ref_cache]
    for mine, theirs in zip(done.prompt_cache, ref_cache, strict=True):
        assert type(mine) is type(theirs)
        for (_, a), (_, b) in zip(tree_flatten(theirs.state), tree_flatten(mine.state),
                                  strict=True):  # fmt: skip
            assert_bitwise_equal(mx.array(a), mx.array(b), "the returned cache")


def test_draft_request_without_a_draft_model_is_refused(models: Any) -> None:
    got, got_tok = models("llama", "self")[3:5]
    engine = Engine(got)
    try:
        req = GenerationRequest(prompt=mx.array([1, 2, 3]), speculation=Speculation("draft", 2))
        with pytest.raises(ValueError, match="draft model"):
            engine.submit(req)
    finally:
        engine.close()


def test_engine_thread_takes_a_driven_draft_row_over(models: Any) -> None:
    """A request arriving mid-stream: the engine thread continues the draft row (with the key
    its last draw left), the newcomer waits for it to end, and the stream is mlx-lm's."""
    import threading

    ref, ref_tok, ref_draft, got, got_tok, got_draft = models("qwen3", "self")
    p = prompt(ref_tok, SHORT)
    kw = {"max_tokens": 12, "num_draft_tokens": 2}
    mx.random.seed(11)
    want = [(r.token, r.from_draft) for r in mlx_lm.stream_generate(
        ref, ref_tok, p, draft_model=ref_draft, sampler=make_sampler(1.0), **kw)]  # fmt: skip
    engine = engine_for(got)
    before = engine.paths["driven->engine thread"]
    other: list[Any] = []
    mx.random.seed(11)
    out = []
    for i, r in enumerate(mlxd.stream_generate(got, got_tok, p, draft_model=got_draft,
                                               sampler=make_sampler(1.0), **kw)):  # fmt: skip
        out.append((r.token, r.from_draft))
        if i == 2:
            req = GenerationRequest(prompt=mx.array(p), max_tokens=3)
            t = threading.Thread(target=lambda r: other.append(list(engine.submit(r))), args=(req,))
            t.start()
    t.join(timeout=60)
    assert out == want
    assert len(other) == 1 and len(other[0]) == 3
    assert engine.paths["driven->engine thread"] == before + 1
