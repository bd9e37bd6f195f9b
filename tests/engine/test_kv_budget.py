"""KV budget admission: rows wait until their worst-case KV fits; a request that can never
fit is refused at submit with a message naming the limit."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxd.engine.admission import KVBudgetExceeded, KVCost
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest


@pytest.fixture(scope="module", params=["qwen3", "gemma3", "lfm2"])
def model(request, tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model(request.param)))[0]


def _req(n_prompt: int, n_gen: int) -> GenerationRequest:
    return GenerationRequest(prompt=mx.arange(1, n_prompt + 1), max_tokens=n_gen)


def test_probe_matches_real_cache_bytes(model) -> None:
    """The worst case equals the bytes a real cache holds after that many tokens
    (allocation included: KV caches grow in steps of 256 tokens)."""
    cost = KVCost.probe(model)
    cache = make_prompt_cache(model)
    model(mx.arange(1, 41)[None], cache=cache)
    held = sum(c.nbytes for c in cache)
    assert cost.worst(_req(30, 10)) == held


def test_rows_wait_for_kv_and_all_finish(model) -> None:
    one = KVCost.probe(model).worst(_req(20, 12))
    engine = Engine(model, batch=8, kv_budget=int(one * 2.5))
    try:
        handles = engine.submit_many([_req(20, 12) for _ in range(4)])
        peak = 0
        for h in handles:
            for _ in h:
                stats = engine.stats()
                peak = max(peak, stats["active"])
                assert stats["kv_bytes_reserved"] <= engine.kv_budget
        assert peak == 2 and all(h.done.reason == "length" for h in handles)
    finally:
        engine.close()


def test_request_that_never_fits_is_refused_naming_the_limit(model) -> None:
    one = KVCost.probe(model).worst(_req(20, 12))
    engine = Engine(model, kv_budget=one)
    try:
        with pytest.raises(KVBudgetExceeded, match=f"kv_budget is {one} bytes"):
            engine.submit(_req(20, 300))
        assert len(list(engine.submit(_req(20, 12)))) == 12  # still serving
    finally:
        engine.close()


def test_a_drafting_row_reserves_its_drafts(model) -> None:
    """A verify step writes max_draft positions before cutting the rejected ones back: a row
    that drafts is reserved as if its output were that much longer."""
    from mlxd.engine.request import Speculation

    cost = KVCost.probe(model)
    req = _req(250, 6)  # 256 tokens: drafts cross the cache's 256-token allocation step
    req.speculation = Speculation("ngram", 8)
    assert cost.worst(req) == cost.worst(_req(250, 14)) > cost.worst(_req(250, 6))
