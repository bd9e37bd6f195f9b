"""A lone stream read on the main thread runs the engine's turns there (engine/driver.py).

Which thread runs a turn must change nothing but the thread: the tokens and logprobs are
compared with mlx-lm's generate_step and with the engine thread's own runs; another request
takes the rows back to the engine thread; a reader that stops early, or an engine that closes
under a driver, leaves nothing running.
"""

import threading
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxd.engine.engine import Engine
from mlxd.engine.overlap import run_on_worker
from mlxd.engine.request import GenerationRequest
from mlxd.engine.serial import SerialRow

PROMPT = [3, 14, 15, 92, 65, 35]


@pytest.fixture(scope="module")
def loaded(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


@pytest.fixture
def decode_threads(monkeypatch) -> list[int]:
    """The threads that ran each serial decode step, in order."""
    seen: list[int] = []
    real = SerialRow.decode

    def spy(self):
        seen.append(threading.get_ident())
        return real(self)

    monkeypatch.setattr(SerialRow, "decode", spy)
    return seen


def _on_worker(job: Callable[[], object]) -> object:
    """Run `job` on a pooled non-main thread (threads that ran MLX must not end: overlap.py)."""
    out: list[object] = []
    done = threading.Event()
    run_on_worker(lambda: out.append(job()), done)
    assert done.wait(120)
    return out[0]


def _reference(model, n: int, prompt: list[int] = PROMPT) -> tuple[list[int], list[mx.array]]:
    pairs = list(generate_step(mx.array(prompt), model, max_tokens=n))
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def _same(got: list[mx.array], ref: list[mx.array]) -> bool:
    pairs = zip(got, ref, strict=True)
    return len(got) == len(ref) and all(mx.array_equal(a, b).item() for a, b in pairs)


def test_a_lone_stream_on_the_main_thread_runs_its_turns_there(loaded, decode_threads) -> None:
    from mlxd import stream_generate

    model, tokenizer = loaded
    ref_tokens, ref_lps = _reference(model, 10)
    out = list(stream_generate(model, tokenizer, PROMPT, max_tokens=10))
    assert [r.token for r in out] == ref_tokens
    assert _same([r.logprobs for r in out], ref_lps)
    assert decode_threads and set(decode_threads) == {threading.get_ident()}


def test_a_stream_read_off_the_main_thread_waits_for_the_engine_thread(
    loaded, decode_threads
) -> None:
    from mlxd import stream_generate

    model, tokenizer = loaded
    ref_tokens, ref_lps = _reference(model, 10)

    def read() -> tuple[int, list]:
        return threading.get_ident(), list(stream_generate(model, tokenizer, PROMPT, max_tokens=10))

    reader, out = _on_worker(read)
    assert [r.token for r in out] == ref_tokens
    assert _same([r.logprobs for r in out], ref_lps)
    threads = set(decode_threads)
    assert len(threads) == 1 and threading.get_ident() not in threads and reader not in threads


def test_detokenizing_happens_in_the_turn_that_makes_the_token(
    loaded, tiny_model, decode_threads
) -> None:
    """As mlx-lm's loop detokenizes beside its step: whichever thread runs the turns."""
    from mlx_lm import load

    from mlxd import stream_generate

    model = loaded[0]
    tokenizer = load(str(tiny_model("qwen3")))[1]  # a tokenizer of its own to spy on
    seen: list[int] = []
    inner = type(tokenizer._detokenizer)

    class Spy(inner):  # type: ignore[misc, valid-type]
        def add_token(self, token: int) -> None:
            seen.append(threading.get_ident())
            super().add_token(token)

    spy = Spy.__new__(Spy)
    spy.__dict__.update(tokenizer._detokenizer.__dict__)
    tokenizer._detokenizer = spy
    texts = [r.text for r in stream_generate(model, tokenizer, PROMPT, max_tokens=8)]
    assert len(texts) == 8 and set(seen) == set(decode_threads) == {threading.get_ident()}
    seen.clear()
    decode_threads.clear()
    _on_worker(lambda: list(stream_generate(model, tokenizer, PROMPT, max_tokens=8)))
    assert seen and set(seen) == set(decode_threads)
    assert threading.get_ident() not in seen


def test_a_second_request_takes_the_rows_back_to_the_engine_thread(loaded, decode_threads) -> None:
    """While the main thread drives, a request from elsewhere arrives: the driver hands its row
    over before its next turn, the engine thread runs both from then on, and both end with the
    tokens the engine gives them undriven."""
    model, _ = loaded
    n = 24

    def run(drive: bool) -> tuple[list[int], list[int]]:
        engine = Engine(model)
        try:
            req = GenerationRequest(prompt=mx.array(PROMPT), max_tokens=n)
            first = engine.submit_driven(req) if drive else engine.submit(req)
            events = engine.drive(first) if drive else iter(first)
            mine = [next(events).token for _ in range(3)]
            second = engine.submit(GenerationRequest(prompt=mx.array(PROMPT[:4]), max_tokens=n))
            mine += [e.token for e in events]
            return mine, [e.token for e in second]
        finally:
            engine.close()

    driven = run(True)
    main = threading.get_ident()
    assert decode_threads[:3] == [main] * 3  # the first tokens were made here
    assert main not in decode_threads[3:]  # then the engine thread took the rows back
    decode_threads.clear()
    assert driven == run(False)
    assert main not in decode_threads


def test_a_driven_stream_closed_early_frees_its_row(loaded) -> None:
    from mlxd import stream_generate
    from mlxd.engine.api import engine_for

    model, tokenizer = loaded
    gen = stream_generate(model, tokenizer, PROMPT, max_tokens=50)
    assert [next(gen).token for _ in range(2)]
    gen.close()
    engine = engine_for(model)
    deadline = time.monotonic() + 30
    while engine.stats()["active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["active"] == 0 and engine.driver.handle is None
    ref_tokens, _ = _reference(model, 6)  # and the next stream is served (and driven) as usual
    assert [r.token for r in stream_generate(model, tokenizer, PROMPT, max_tokens=6)] == ref_tokens


def test_closing_the_engine_under_a_driver_ends_its_row(loaded) -> None:
    model, _ = loaded
    engine = Engine(model)
    handle = engine.submit_driven(GenerationRequest(prompt=mx.array(PROMPT), max_tokens=500))
    events = engine.drive(handle)
    assert [next(events) for _ in range(2)]
    closer = threading.Thread(target=engine.close)
    closer.start()  # close() waits for the engine thread, which needs the turn lock
    rest = list(events)
    closer.join(30)
    assert not closer.is_alive() and not engine.alive
    assert handle.done is not None and handle.done.reason == "cancelled"
    assert len(rest) < 498


def test_a_sampled_row_handed_over_keeps_its_key_and_its_bits(loaded, decode_threads) -> None:
    """`batch=1`: a seeded row driven for three tokens, then handed over when a second request
    arrives, ends with exactly mlx-lm's seeded tokens and logprobs: its PRNG key (per thread in
    MLX) and its lazy arrays moved with it (serial.py `_schedule`, driver.py `Driver.take_back`)."""
    from mlx_lm.sample_utils import make_sampler

    from mlxd.engine.sampling import SamplingParams

    model, _ = loaded
    mx.random.seed(42)
    ref = list(generate_step(mx.array(PROMPT), model, max_tokens=12, sampler=make_sampler(1.0)))
    engine = Engine(model, batch=1)
    try:
        req = GenerationRequest(
            prompt=mx.array(PROMPT), max_tokens=12, sampling=SamplingParams(temp=1.0), seed=42
        )
        first = engine.submit_driven(req)
        events = engine.drive(first)
        got = [next(events) for _ in range(3)]
        second = engine.submit(GenerationRequest(prompt=mx.array(PROMPT[:3]), max_tokens=4))
        got += list(events)
        assert [e.token for e in got] == [t for t, _ in ref]
        assert _same([e.logprobs for e in got], [lp for _, lp in ref])
        assert [e.token for e in second] == _reference(model, 4, PROMPT[:3])[0]
        paths = engine.stats()["paths"]  # which path each request took
        assert paths["driven"] == paths["driven->engine thread"] == 1
        assert paths["serial"] == 2
    finally:
        engine.close()
    main = threading.get_ident()
    assert decode_threads[:3] == [main] * 3 and main not in decode_threads[3:]


@pytest.mark.parametrize("batch", [1, 8])
def test_a_paused_driver_does_not_hold_up_others(loaded, decode_threads, batch: int) -> None:
    """The main thread drives three tokens of a seeded row, then stops asking (as a notebook
    cell might). A request from another thread still runs to its end: the engine thread takes
    the paused row between turns (each driven turn left nothing lazy and its drawn key at hand).
    Resumed later, the row ends with mlx-lm's seeded tokens at batch=1."""
    from mlx_lm.sample_utils import make_sampler

    from mlxd.engine.sampling import SamplingParams

    model, _ = loaded
    mx.random.seed(7)
    ref = [t for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=16,
                                       sampler=make_sampler(1.0))]  # fmt: skip
    engine = Engine(model, batch=batch)
    try:
        req = GenerationRequest(
            prompt=mx.array(PROMPT), max_tokens=16, sampling=SamplingParams(temp=1.0), seed=7
        )
        first = engine.submit_driven(req)
        events = engine.drive(first)
        got = [next(events).token for _ in range(3)]
        other = GenerationRequest(prompt=mx.array(PROMPT[:4]), max_tokens=5)
        tokens = _on_worker(lambda: [e.token for e in engine.submit(other)])
        assert len(tokens) == 5  # finished while the main thread was away
        if batch == 1:  # alone after the first: its solo bits (batched, BatchGenerator's)
            assert tokens == _reference(model, 5, PROMPT[:4])[0]
        got += [e.token for e in events]
        assert len(got) == 16
        if batch == 1:
            assert got == ref
        assert engine.stats()["paths"]["driven->engine thread"] == 1
    finally:
        engine.close()
    main = threading.get_ident()
    assert decode_threads[:3] == [main] * 3 and main not in decode_threads[3:]


def test_a_row_taken_mid_prefill_continues_on_the_engine_thread(loaded) -> None:
    """Two driven turns prefill two 4-token chunks of a long prompt, then the reader stops; a
    request from another thread makes the engine thread take the row mid-prefill. The prompt
    slices the driver made were scheduled after its turns (MLX streams are per thread), so the
    row goes on there and ends with generate_step's tokens (batch=1)."""
    model, _ = loaded
    prompt = list(range(40, 80))
    ref = [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=6, prefill_step_size=4)]
    engine = Engine(model, batch=1)
    try:
        req = GenerationRequest(prompt=mx.array(prompt), max_tokens=6, prefill_step_size=4)
        first = engine.submit_driven(req)
        assert engine.driver.drive_once(first) and engine.driver.drive_once(first)
        assert engine.rows.serial is not None and engine.rows.serial[0].processed == 8
        other = GenerationRequest(prompt=mx.array(PROMPT), max_tokens=3)
        assert len(_on_worker(lambda: [e.token for e in engine.submit(other)])) == 3
        assert [e.token for e in engine.drive(first)] == ref
        assert first.done is not None and first.done.reason == "length"
    finally:
        engine.close()


def test_a_failing_driven_turn_ends_its_row_and_the_engine_serves_on(loaded, monkeypatch) -> None:
    """A turn that fails on the driver's thread is caught as on the engine thread (turns.py):
    the row ends with the error, raised in the reader, and the next stream is served."""
    from mlxd import stream_generate

    model, tokenizer = loaded
    real, calls = SerialRow.decode, []

    def failing(self):
        calls.append(threading.get_ident())
        if len(calls) == 3:
            raise RuntimeError("step failed")
        return real(self)

    monkeypatch.setattr(SerialRow, "decode", failing)
    got = []
    with pytest.raises(RuntimeError, match="step failed"):
        for r in stream_generate(model, tokenizer, PROMPT, max_tokens=10):
            got.append(r.token)
    assert len(got) == 2 and set(calls) == {threading.get_ident()}
    monkeypatch.setattr(SerialRow, "decode", real)
    assert [r.token for r in stream_generate(model, tokenizer, PROMPT, max_tokens=6)] == (
        _reference(model, 6)[0]
    )


def test_a_row_handed_over_right_after_its_kv_was_quantized_keeps_its_bits(loaded) -> None:
    """The driven turn that converts the KV cache (mlx-lm's kv_bits) leaves the converted
    layers lazy on the driver's stream; they are scheduled with that step (serial.py
    `_schedule`), so the engine thread taking the row at once goes on with generate_step's
    tokens and logprobs."""
    from mlx_lm.models.cache import QuantizedKVCache

    model, _ = loaded
    kv = dict(kv_bits=8, kv_group_size=32, quantized_kv_start=len(PROMPT) + 2)
    ref = list(generate_step(mx.array(PROMPT), model, max_tokens=8, **kv))
    engine = Engine(model, batch=1)
    try:
        first = engine.submit_driven(GenerationRequest(prompt=mx.array(PROMPT), max_tokens=8, **kv))
        turns = 0
        while engine.rows.serial is None or not isinstance(
            engine.rows.serial[0].cache[0], QuantizedKVCache
        ):
            assert engine.driver.drive_once(first)
            turns += 1
        assert 1 < turns < 8  # converted mid-stream, by a driven turn
        other = GenerationRequest(prompt=mx.array(PROMPT[:3]), max_tokens=2)
        assert len(_on_worker(lambda: [e.token for e in engine.submit(other)])) == 2
        got = list(engine.drive(first))
        assert [e.token for e in got] == [t for t, _ in ref]
        assert _same([e.logprobs for e in got], [lp for _, lp in ref])
        assert engine.stats()["paths"]["driven->engine thread"] == 1
    finally:
        engine.close()


def test_a_greedy_row_handed_over_ends_with_the_key_it_came_with(loaded) -> None:
    """Greedy decoding never draws, so under mlx-lm the caller's PRNG key is unchanged after
    it; a greedy row carrying the caller's key and taken by the engine thread mid-stream ends
    with that same key (not the engine thread's), which stream_generate gives back."""
    model, _ = loaded
    key = (0, 123457)
    engine = Engine(model, batch=1)
    try:
        req = GenerationRequest(prompt=mx.array(PROMPT), max_tokens=6, random_key=key)
        first = engine.submit_driven(req)
        assert engine.driver.drive_once(first) and engine.driver.drive_once(first)
        other = GenerationRequest(prompt=mx.array(PROMPT[:3]), max_tokens=2)
        assert len(_on_worker(lambda: [e.token for e in engine.submit(other)])) == 2
        assert [e.token for e in engine.drive(first)] == _reference(model, 6)[0]
        assert first.done is not None and first.done.random_key == key
        assert engine.stats()["paths"]["driven->engine thread"] == 1
    finally:
        engine.close()
