"""The Engine: its own thread, FIFO admission under a cap, cancellation, errors, asyncio.

A lone row runs mlx-lm's generate_step op for op, so its tokens and logprobs equal it;
`batch=1` keeps that true under load. Batched rows are tested in test_batching.py.
"""

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from fixtures.memory import settled_active_memory
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxd.engine.engine import Engine, Overloaded
from mlxd.engine.request import GenerationRequest
from mlxd.engine.rng import current_key


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))[0]


def _reference(model, prompt: list[int], n: int, seed: int | None = None):
    sampler = make_sampler(temp=1.0, top_k=50) if seed is not None else None
    if seed is not None:
        mx.random.seed(seed)
    out = [
        (t, lp) for t, lp in generate_step(mx.array(prompt), model, max_tokens=n, sampler=sampler)
    ]
    return [t for t, _ in out], [lp for _, lp in out]


def _request(prompt: list[int], n: int, seed: int | None = None) -> GenerationRequest:
    if seed is None:
        return GenerationRequest(prompt=mx.array(prompt), max_tokens=n)
    mx.random.seed(seed)
    return GenerationRequest(
        prompt=mx.array(prompt),
        max_tokens=n,
        sampler=make_sampler(temp=1.0, top_k=50),
        random_key=current_key(),
    )


PROMPTS = [[1, 2, 3, 4, 5], [10, 20, 30], list(range(100, 140)), [7] * 12]


def test_batch_1_pins_serial_numerics_under_load(model) -> None:
    """`batch=1`: queued rows run one at a time, each equal to its solo generate_step run."""
    engine = Engine(model, batch=1)
    try:
        seeds = [None, 11, None, 12]
        handles = [engine.submit(_request(p, 10, s)) for p, s in zip(PROMPTS, seeds, strict=True)]
        results = [list(h) for h in handles]
        for prompt, seed, events, handle in zip(PROMPTS, seeds, results, handles, strict=True):
            tokens, logprobs = _reference(model, prompt, 10, seed)
            assert [e.token for e in events] == tokens
            assert all(
                mx.array_equal(e.logprobs, lp).item()
                for e, lp in zip(events, logprobs, strict=True)
            )
            assert handle.done is not None and handle.done.reason == "length"
    finally:
        engine.close()


def test_cap_queues_fifo_and_full_queue_is_overloaded(model) -> None:
    engine = Engine(model, batch=1, max_queue=2)
    try:
        first = iter(engine.submit(_request(PROMPTS[2], 30)))
        next(first)  # now running: the queue is empty
        queued = [engine.submit(_request(PROMPTS[0], 3)) for _ in range(2)]
        with pytest.raises(Overloaded):
            engine.submit(_request(PROMPTS[0], 3))
        assert (engine.stats()["active"], engine.stats()["waiting"]) == (1, 2)
        assert len(list(first)) == 29 and all(len(list(h)) == 3 for h in queued)
    finally:
        engine.close()


@pytest.mark.parametrize("when", ["queued", "decoding"])
def test_cancel_frees_the_row_and_memory(model, when: str) -> None:
    engine = Engine(model, batch=1)
    try:
        blocker = engine.submit(_request(PROMPTS[2], 20))
        victim = engine.submit(_request(PROMPTS[1], 10_000))
        if when == "queued":
            victim.cancel()
        else:
            for i, _ in enumerate(victim):
                if i == 0:
                    list(blocker)  # the victim starts only after the blocker
                if i == 5:
                    victim.cancel()
        done = victim.wait()
        assert done.reason == "cancelled"
        list(blocker)
        assert engine.stats()["active"] == engine.stats()["waiting"] == 0
        before = settled_active_memory()
        tokens = [e.token for e in engine.submit(_request(PROMPTS[0], 5))]
        # A leaked row would hold its KV cache and a 600 KB logprobs vector; MLX keeps ~20 bytes
        # per request when arrays cross threads, so the bound is a few KB, not zero.
        assert len(tokens) == 5 and settled_active_memory() <= before + 4096
    finally:
        engine.close()


def test_bad_request_errors_and_engine_keeps_serving(model) -> None:
    engine = Engine(model, batch=2)
    try:
        with pytest.raises(ValueError, match="non-zero"):
            engine.submit(GenerationRequest(prompt=mx.array([1, 2]), max_tokens=0))
        # mlx-lm cannot quantize a rotating cache: the row fails with its error, alone.
        bad = GenerationRequest(
            prompt=mx.array([1, 2, 3]), kv_bits=4, quantized_kv_start=0, max_kv_size=8
        )
        with pytest.raises(NotImplementedError):
            list(engine.submit(bad))
        good = [e.token for e in engine.submit(_request(PROMPTS[0], 4))]
        assert good == _reference(model, PROMPTS[0], 4)[0]
    finally:
        engine.close()


def test_stop_tokens_end_the_row(model) -> None:
    tokens, _ = _reference(model, PROMPTS[0], 8)
    engine = Engine(model)
    try:
        stop = tokens[3]
        req = GenerationRequest(prompt=mx.array(PROMPTS[0]), max_tokens=8, stop_token_ids={stop})
        handle = engine.submit(req)
        got = [e.token for e in handle]
        assert got == tokens[: tokens.index(stop) + 1] and handle.done.reason == "stop"
    finally:
        engine.close()


def test_asyncio_consumers(model) -> None:
    engine = Engine(model, batch=3)

    async def consume(prompt: list[int]) -> list[int]:
        return [e.token async for e in engine.submit(_request(prompt, 6))]

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(consume(p) for p in PROMPTS[:3]))

    try:
        results = asyncio.run(main())
        for prompt, got in zip(PROMPTS[:3], results, strict=True):
            assert got == _reference(model, prompt, 6)[0]
    finally:
        engine.close()


def test_engine_runs_on_its_own_thread(model) -> None:
    engine = Engine(model)
    try:
        assert (
            engine._thread.name == "mlxd-engine"
            and engine._thread is not threading.current_thread()
        )
        engine.close()
        with pytest.raises(RuntimeError, match="closed"):
            engine.submit(_request(PROMPTS[0], 2))
    finally:
        engine.close()


@pytest.mark.parametrize("concurrent", [1, 3], ids=["serial", "batched"])
def test_token_events_carry_logprob_top_logprobs_and_finish(
    model, concurrent: int, monkeypatch
) -> None:
    """`logprob` is the sampled token's entry of the logprob vector and `top_logprobs` the k
    largest entries (mlx_lm.server computes them with argpartition: compared as sets here, each
    value equal to the vector's own); the last event names the finish reason. Both paths build
    them in the step's graph (Readout), so reading them back adds no ops."""
    from mlxd.engine.output import RowOutput

    built_in_step: list[bool] = []
    token = RowOutput.token

    def spy(self, tok, logprobs, read=None):
        built_in_step.append(read is not None)
        return token(self, tok, logprobs, read)

    monkeypatch.setattr(RowOutput, "token", spy)
    engine = Engine(model, batch=4)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=6, logprob=True, top_logprobs=5)
            for p in PROMPTS[:concurrent]
        ]
        handles = engine.submit_many(reqs)
        for handle in handles:
            events = list(handle)
            assert [e.finish for e in events] == [None] * 5 + ["length"]
            for e in events:
                vector = e.logprobs.tolist()
                assert e.logprob == vector[e.token]
                best = sorted(range(len(vector)), key=lambda i: -vector[i])[:5]
                assert {i for i, _ in e.top_logprobs} == set(best)
                assert all(lp == vector[i] for i, lp in e.top_logprobs)
        # Every token's figures come from its step's graph, but a batched row's first token:
        # mlx-lm's prompt batch samples that one.
        assert len(built_in_step) == 6 * concurrent
        assert built_in_step.count(False) == (0 if concurrent == 1 else concurrent)
    finally:
        engine.close()


def test_a_bad_sampler_bound_is_refused_at_submit_and_the_engine_serves_on(model) -> None:
    """mlx-lm's XTC checks its threshold only when it first samples, inside a step the whole
    batch shares; the engine checks it at submit, so no running row is hurt."""
    from mlxd.engine.sampling import SamplingParams

    engine = Engine(model, batch=4)
    try:
        running = engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[0]), max_tokens=8))
        bad = GenerationRequest(
            prompt=mx.array(PROMPTS[1]),
            max_tokens=4,
            sampling=SamplingParams(temp=1.0, xtc_probability=0.5, xtc_threshold=0.7),
        )
        with pytest.raises(ValueError, match=r"xtc_threshold must be in \[0, 0.5\]"):
            engine.submit(bad)
        assert len(list(running)) == 8 and running.done.reason == "length"
    finally:
        engine.close()


def test_a_failing_batched_step_ends_its_rows_and_the_engine_serves_on(model) -> None:
    """A sampler that raises inside the batched step ends the rows of that step with the
    error; the engine thread survives and serves the next request."""

    def broken(logprobs: mx.array) -> mx.array:
        raise RuntimeError("sampler exploded")

    engine = Engine(model, batch=4)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=4, sampler=broken) for p in PROMPTS[:2]
        ]
        for handle in engine.submit_many(reqs):
            with pytest.raises(RuntimeError, match="sampler exploded"):
                list(handle)
        after = engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[2]), max_tokens=3))
        assert len(list(after)) == 3 and engine.alive
    finally:
        engine.close()


def test_an_unexpected_turn_failure_fails_running_rows_not_the_engine(model) -> None:
    """Whatever escapes a turn (here a deliberately broken serial turn) ends the running rows
    with that error; the loop goes on and the next request is served."""
    engine = Engine(model, batch=4)
    try:
        real = engine.rows.serial_turn
        calls = []

        def fail_once() -> None:
            if not calls:
                calls.append(1)
                raise RuntimeError("turn exploded")
            real()

        engine.rows.serial_turn = fail_once
        first = engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[0]), max_tokens=4))
        with pytest.raises(RuntimeError, match="turn exploded"):
            list(first)
        after = engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[1]), max_tokens=3))
        assert len(list(after)) == 3 and engine.alive
    finally:
        engine.close()


@pytest.mark.parametrize("where", ["none", "batched step", "serial row", "turn", "fork"])
def test_a_failed_step_releases_mlxs_buffer_cache(model, monkeypatch, where: str) -> None:
    """MLX-CUDA throws on a failed allocation without releasing its own cached buffers, so
    after a failed step the engine clears them, even with clearing off (CUDA's default);
    "none": the same requests succeeding clear nothing (the control)."""
    from mlxd.config import EngineConfig
    from mlxd.engine.moves import ForkJob

    def broken(*_: Any) -> Any:
        raise MemoryError("out of memory, say")

    cleared: list[int] = []
    real = mx.clear_cache
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1) or real())
    engine = Engine(model, batch=4, config=EngineConfig(4, 4, 2048, clear_cache=False))
    try:
        if where == "turn":  # whatever escapes a turn: the serial turn fails once
            real_turn = engine.rows.serial_turn
            engine.rows.serial_turn = broken
        if where == "fork":  # an n > 1 request's shared prefill
            monkeypatch.setattr(ForkJob, "step", broken)
            handles = engine.submit_n(GenerationRequest(prompt=mx.array(PROMPTS[0])), 2)
        else:
            sampler = broken if where in ("batched step", "serial row") else None
            prompts = PROMPTS[:2] if where == "batched step" else PROMPTS[:1]
            reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=3, sampler=sampler)
                    for p in prompts]  # fmt: skip
            handles = engine.submit_many(reqs)
        for handle in handles:
            if where == "none":
                assert len(list(handle)) == 3
            else:
                with pytest.raises(MemoryError):
                    list(handle)
        assert (len(cleared) > 0) == (where != "none"), cleared
        if where == "turn":
            engine.rows.serial_turn = real_turn
        after = engine.submit(GenerationRequest(prompt=mx.array(PROMPTS[2]), max_tokens=3))
        assert len(list(after)) == 3 and engine.alive
    finally:
        engine.close()


def test_a_serial_row_clears_the_buffer_cache_where_generate_step_does(model, monkeypatch) -> None:
    """mlx-lm clears after each prefill chunk and, every 256 tokens, after it has yielded the
    token: the token goes out first. The serial row clears at the same points of the token
    sequence (it used to clear before handing token 0 over, so the first token waited for
    the next step too)."""
    from mlx_lm.generate import generation_stream

    from mlxd.engine.serial import SerialRow

    log: list[object] = []
    clear = mx.clear_cache
    monkeypatch.setattr(mx, "clear_cache", lambda: (log.append("clear"), clear())[1])
    prompt = mx.array(PROMPTS[2])  # 40 tokens in 16-token chunks: three prefill clears
    for token, _ in generate_step(prompt, model, max_tokens=4, prefill_step_size=16):
        log.append(token)
    expected, log[:] = list(log), []
    row = SerialRow(model, GenerationRequest(prompt=prompt, max_tokens=4, prefill_step_size=16),
                    generation_stream)  # fmt: skip
    while row.prefilling:
        row.prefill_chunk()
    while (step := row.decode()) is not None:
        log.append(step.token)
    assert log == expected and expected.count("clear") == 4
