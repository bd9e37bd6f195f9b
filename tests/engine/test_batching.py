"""B >= 2 on the engine: rows admitted together equal mlx-lm's BatchGenerator at that
composition; rows join mid-flight (the serial row hands its caches over) and leave; requests
the batched step cannot run wait and run alone, never downgraded."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from mlx_lm.generate import BatchGenerator, generate_step

from mlxd.engine.engine import Engine
from mlxd.engine.moves import drain_keeps_bits
from mlxd.engine.request import GenerationRequest

TEXTS = ["Hello there my friend", "Tell me a long story about a cat and a dog please", "x"]


def _load(tiny_model: Callable[..., Path], arch: str):
    from mlx_lm import load

    return load(str(tiny_model(arch)))


def _oracle(model, prompts: list[list[int]], n: int, eos: frozenset[int]):
    return batch_generator_outputs(model, prompts, n, eos)


def _req(prompt: list[int], n: int, eos: frozenset[int] = frozenset(), **kw) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=n, stop_token_ids=eos, **kw)


@pytest.mark.parametrize("arch", ["qwen3", "lfm2", "gemma3"])
def test_admitted_together_equals_batch_generator(tiny_model, arch: str) -> None:
    model, tok = _load(tiny_model, arch)
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    expected = _oracle(model, prompts, 12, eos)
    engine = Engine(model)
    try:
        handles = engine.submit_many([_req(p, 12, eos) for p in prompts])
        for handle, ref in zip(handles, expected, strict=True):
            got = [(e.token, e.logprobs) for e in handle]
            assert [t for t, _ in got] == [t for t, _ in ref]
            assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, ref, strict=True))
        assert engine.paths == {"batched": 3}
    finally:
        engine.close()


def test_join_mid_flight_keeps_the_serial_prefix_and_both_finish(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    long_prompt, short_prompt = tok.encode(TEXTS[1]), tok.encode(TEXTS[0])
    solo = [t for t, _ in generate_step(mx.array(long_prompt), model, max_tokens=30)]
    engine = Engine(model)
    try:
        first = engine.submit(_req(long_prompt, 30))
        stream = iter(first)
        before = [next(stream).token for _ in range(5)]  # B=1: the serial fast path
        second = engine.submit(_req(short_prompt, 10))
        after = [e.token for e in stream]
        joined = [e.token for e in second]
        assert before == solo[:5]
        assert len(before + after) == 30 and len(joined) == 10
        assert first.done.reason == "length" and second.done.reason == "length"
        paths = {"serial": 1, "batched": 1, "serial->batched": 1}
        if drain_keeps_bits("mlx"):  # on MLX-CUDA the last row stays batched (moves.py)
            paths["batched->serial"] = 1
        assert engine.paths == paths
        assert engine.stats()["active"] == engine.stats()["waiting"] == 0
        # every token counts once, the one the serial row emits as it joins the batch too
        assert engine.stats()["tokens_generated"] == 40
    finally:
        engine.close()


def test_identical_concurrent_requests_give_identical_outputs(tiny_model) -> None:
    model, tok = _load(tiny_model, "llama")
    prompt = tok.encode(TEXTS[1])
    engine = Engine(model)
    try:
        a, b = engine.submit_many([_req(prompt, 16), _req(prompt, 16)])
        ta, tb = [(e.token, e.logprobs) for e in a], [(e.token, e.logprobs) for e in b]
        assert [t for t, _ in ta] == [t for t, _ in tb]
        assert all(mx.array_equal(x, y).item() for (_, x), (_, y) in zip(ta, tb, strict=True))
    finally:
        engine.close()


def test_unbatchable_request_waits_and_runs_alone_exactly(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompt = tok.encode(TEXTS[1])
    window = {"max_kv_size": 6}  # a rotating cache of its own size cannot merge with the batch's
    solo = list(generate_step(mx.array(prompt), model, max_tokens=8, **window))
    engine = Engine(model)
    try:
        running = engine.submit_many([_req(prompt, 20), _req(prompt, 20)])
        alone = engine.submit(_req(prompt, 8, **window))
        got = [(e.token, e.logprobs) for e in alone]
        assert all(h.done is None or h.done.reason == "length" for h in running)
        assert [t for t, _ in got] == [t for t, _ in solo]
        assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, solo, strict=True))
        assert all(len(list(h)) == 20 for h in running)
        assert engine.paths == {"batched": 2, "alone": 1}
    finally:
        engine.close()


def test_cancel_one_batched_row_others_finish(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    engine = Engine(model)
    try:
        handles = engine.submit_many([_req(p, 25) for p in prompts])
        victim = iter(handles[1])
        next(victim)
        handles[1].cancel()
        assert handles[1].wait().reason == "cancelled"
        assert [len(list(h)) for h in (handles[0], handles[2])] == [25, 25]
        assert engine.stats()["active"] == engine.stats()["waiting"] == 0
    finally:
        engine.close()


def test_stop_token_ends_a_batched_row(tiny_model) -> None:
    model, tok = _load(tiny_model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS[:2]]
    ref = _oracle(model, prompts, 12, frozenset())
    stop = ref[0][4][0]
    engine = Engine(model)
    try:
        a, b = engine.submit_many([_req(prompts[0], 12, frozenset({stop})), _req(prompts[1], 12)])
        got_a = [e.token for e in a]
        assert got_a == [t for t, _ in ref[0]][: got_a.index(stop) + 1]
        assert a.done.reason == "stop" and len(list(b)) == 12
    finally:
        engine.close()


def _long_and_short(model, tok) -> tuple[list, list, list, list, dict]:
    """A long and a short prompt admitted together: BatchGenerator's (token, logprobs) for
    each, then the engine's, and the paths its rows took."""
    long_p, short_p = tok.encode(TEXTS[1]), tok.encode("Hi")
    gen = BatchGenerator(model)
    uids = gen.insert([long_p, short_p], max_tokens=[30, 5])
    ref: dict[int, list] = {u: [] for u in uids}
    while responses := gen.next_generated():
        for r in responses:
            ref[r.uid].append((r.token, r.logprobs))
    gen.close()
    engine = Engine(model)
    try:
        a, b = engine.submit_many([_req(long_p, 30), _req(short_p, 5)])
        got = [[(e.token, e.logprobs) for e in h] for h in (a, b)]
        return ref[uids[0]], ref[uids[1]], got[0], got[1], dict(engine.paths)
    finally:
        engine.close()


def _equal_logprobs(got: list, want: list) -> bool:
    return all(mx.array_equal(x, y).item() for (_, x), (_, y) in zip(got, want, strict=True))


@pytest.mark.parametrize("arch", ["qwen3", "lfm2", "gemma3"])
def test_batch_drains_back_to_the_serial_fast_path(tiny_model, arch: str) -> None:
    """When the short row ends, the long (unpadded) row leaves the batch for plain serial
    caches and continues with BatchGenerator's very bits (where the backend allows it:
    drain_keeps_bits). gemma3's sliding-window caches change layout when extracted, so there
    only the tokens are held equal (reduction-order noise)."""
    want_a, want_b, got_a, got_b, paths = _long_and_short(*_load(tiny_model, arch))
    assert [t for t, _ in got_b] == [t for t, _ in want_b]
    assert [t for t, _ in got_a] == [t for t, _ in want_a]
    if arch != "gemma3":
        assert _equal_logprobs(got_a, want_a)
    drained = {"batched->serial": 1} if drain_keeps_bits("mlx") else {}
    assert paths == {"batched": 2, **drained}


def test_the_last_row_stays_batched_where_the_drain_would_change_its_bits(
    tiny_model, monkeypatch
) -> None:
    """Where the serial step's attention differs from the batch's (MLX-CUDA), the last row
    finishes inside its batch, with BatchGenerator's tokens and logprob arrays."""
    import mlxd.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "drain_keeps_bits", lambda attention: False)
    want_a, want_b, got_a, got_b, paths = _long_and_short(*_load(tiny_model, "qwen3"))
    assert [t for t, _ in got_b] == [t for t, _ in want_b]
    assert [t for t, _ in got_a] == [t for t, _ in want_a] and _equal_logprobs(got_a, want_a)
    assert paths == {"batched": 2}


def test_the_drain_policy_by_backend(monkeypatch) -> None:
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    assert not drain_keeps_bits("mlx") and drain_keeps_bits("folded")
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    assert drain_keeps_bits("mlx") and drain_keeps_bits("folded")
