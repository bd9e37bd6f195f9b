"""`--step-order thread` (engine/overlap.py): the batched step read and queued on a thread of its
own gives mlx-lm's BatchGenerator bits, through rows that leave, a row that joins mid-flight,
sampled rows and logprob figures; a failure on that thread reaches the engine thread."""

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs

from mlxd.config import EngineConfig
from mlxd.engine import overlap
from mlxd.engine.engine import Engine
from mlxd.engine.overlap import StepEncoder
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams

TEXTS = ["Hello there my friend", "Tell me a long story about a cat", "x", "one two three four"]
THREAD = EngineConfig(8, 8, 2048, step_order="thread", thread_rows=1)


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread each encoder job's queue part ran on (overlap.py's `mx.async_eval`)."""
    names: list[str] = []

    def async_eval(*arrays: Any) -> None:
        names.append(threading.current_thread().name)
        mx.async_eval(*arrays)

    fake = SimpleNamespace(
        **{n: getattr(mx, n) for n in ("eval", "new_thread_unsafe_stream", "array")}
    )
    fake.async_eval, fake.default_device = async_eval, mx.default_device
    monkeypatch.setattr(overlap, "mx", fake)
    return names


def _load(tiny_model: Callable[..., Path], arch: str = "qwen3") -> tuple[Any, Any]:
    from mlx_lm import load

    return load(str(tiny_model(arch)))


def test_thread_order_gives_mlx_lms_bits(tiny_model: Callable[..., Path], encodes: list[str]):
    """Greedy rows together: mlx-lm's BatchGenerator's tokens and logprobs, bit for bit, with
    all but the first step (queued on the engine thread) queued on the encoder's thread."""
    model, tok = _load(tiny_model)
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    ref = batch_generator_outputs(model, prompts, 12, eos, [[] for _ in TEXTS])
    engine = Engine(model, config=THREAD)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=12, stop_token_ids=eos)
            for p in prompts
        ]
        got = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
    finally:
        engine.close()
    assert_same_outputs(got, ref)
    assert len(encodes) >= 9 and set(encodes) == {"mlxd-step-encoder"}


def _mixed_run(model: Any, tok: Any, config: EngineConfig | None) -> list[list[tuple]]:
    """Rows of 6-14 tokens (they leave apart), one sampled with a seed, one reading logprob
    figures, and a fifth joining after the others' 4th token."""
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    lengths = [14, 6, 9, 11]
    params = [
        SamplingParams(),
        SamplingParams(temp=0.8, top_k=20),
        SamplingParams(),
        SamplingParams(),
    ]
    reqs = [
        GenerationRequest(
            prompt=mx.array(p),
            max_tokens=n,
            stop_token_ids=eos,
            sampling=s,
            seed=7 if s.temp else None,
            logprob=e == 2,
            top_logprobs=3 if e == 2 else 0,
        )  # fmt: skip
        for e, (p, n, s) in enumerate(zip(prompts, lengths, params, strict=True))
    ]
    engine = Engine(model, config=config)
    try:
        handles = engine.submit_many(reqs)
        first = iter(handles[0])
        head = [next(first) for _ in range(4)]
        late = engine.submit(GenerationRequest(prompt=mx.array(prompts[3]), max_tokens=8))
        events = [head + list(first)] + [list(h) for h in handles[1:]] + [list(late)]
        assert all(h.done.reason == "length" for h in [*handles, late])
    finally:
        engine.close()
    return [[(e.token, e.logprobs, e.logprob, e.top_logprobs) for e in row] for row in events]


def test_thread_order_through_leaves_a_join_sampling_and_figures(
    tiny_model: Callable[..., Path], encodes: list[str]
) -> None:
    """The same rows in mlxd's default order (mlx-lm's own GenerationBatch step) and in the
    thread order: the same tokens, logprob arrays and figures at every step."""
    model, tok = _load(tiny_model)
    ref = _mixed_run(model, tok, EngineConfig(8, 8, 2048))
    assert encodes == []  # the default order has no encoder
    got = _mixed_run(model, tok, THREAD)
    assert [len(r) for r in got] == [14, 6, 9, 11, 8]
    for g, r in zip(got, ref, strict=True):
        assert [(t, p, k) for t, _, p, k in g] == [(t, p, k) for t, _, p, k in r]
        assert all(
            mx.array_equal(a, b).item() for (_, a, _, _), (_, b, _, _) in zip(g, r, strict=True)
        )
    assert got[2][0][2] is not None and len(got[2][0][3]) == 3  # figures were read
    assert len(encodes) >= 5  # the steps between joins and leaves


def test_batches_below_the_thread_rows_step_on_the_engine_thread(
    tiny_model: Callable[..., Path], encodes: list[str]
) -> None:
    """MLXD_THREAD_ROWS' floor: with 3, the five rows' steps go to the encoder until rows leave
    and fewer than three are left, then run here in mlx-lm's order; the bits are the same as
    with every step on the engine thread, and a floor above the batch hands it none."""
    model, tok = _load(tiny_model)
    ref = _mixed_run(model, tok, EngineConfig(8, 8, 2048))
    got = _mixed_run(model, tok, EngineConfig(8, 8, 2048, step_order="thread", thread_rows=3))
    for g, r in zip(got, ref, strict=True):
        assert [t for t, *_ in g] == [t for t, *_ in r]
        assert all(mx.array_equal(a, b).item() for (_, a, *_), (_, b, *_) in zip(g, r, strict=True))
    floor3, _ = len(encodes), encodes.clear()
    _mixed_run(model, tok, THREAD)  # a floor of 1: every step after a change of rows
    assert 0 < floor3 < len(encodes)
    encodes.clear()
    _mixed_run(model, tok, EngineConfig(8, 8, 2048, step_order="thread", thread_rows=9))
    assert encodes == []


def test_two_batches_encode_one_at_a_time_with_mlx_lms_bits(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows on quantized KV run in a batch of their own beside the plain rows' (moves.py):
    both batches' encoders queue on the one stream, never at the same time, and every row gets
    the tokens and logprobs of the default order."""
    spans: list[tuple[float, float, int]] = []

    def async_eval(*arrays: Any) -> None:
        t0 = time.perf_counter()
        mx.async_eval(*arrays)
        spans.append((t0, time.perf_counter(), threading.get_ident()))

    model, tok = _load(tiny_model)
    eos = frozenset(tok.eos_token_ids)
    kv = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=4)

    def run(config: EngineConfig | None) -> list[list[tuple[int, Any]]]:
        reqs = [
            GenerationRequest(
                prompt=mx.array(tok.encode(t)),
                max_tokens=10,
                stop_token_ids=eos,
                **(kv if e % 2 else {}),
            )  # fmt: skip
            for e, t in enumerate(TEXTS)
        ]
        engine = Engine(model, config=config)
        try:
            return [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
        finally:
            engine.close()

    ref = run(EngineConfig(8, 8, 2048))
    overlap.stream()  # made before the stand-in below replaces mx
    fake = SimpleNamespace(eval=mx.eval, async_eval=async_eval, array=mx.array)
    monkeypatch.setattr(overlap, "mx", fake)
    got = run(THREAD)
    assert_same_outputs(got, ref)
    assert len({t for *_, t in spans}) >= 2  # two encoders took steps
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one at a time


def test_a_failed_read_is_the_steps_error_and_a_failed_queue_the_next_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLX raising on the encoder's thread (as a failed cudaMallocAsync does) reaches the engine
    thread once: from the read, that step's call; from the queue, the next call."""
    bad = mx.array([9])

    def checked(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*arrays: Any) -> Any:
            if any(a is bad for a in arrays):
                raise RuntimeError("out of memory")
            return real(*arrays)

        return call

    shared = overlap.stream()  # arrays the encoder's thread can evaluate (a batch's stream)
    fake = SimpleNamespace(eval=checked(mx.eval), async_eval=checked(mx.async_eval), array=mx.array)
    monkeypatch.setattr(overlap, "mx", fake)
    enc = StepEncoder()
    try:
        ok = mx.array([1, 2])
        with pytest.raises(RuntimeError, match="out of memory"):
            enc.step([bad], ok, [])
        assert enc.step([ok], ok, [bad]) == [1, 2]
        with pytest.raises(RuntimeError, match="out of memory"):
            enc.settle()
        enc.settle()  # raised once; the encoder keeps working
        with mx.stream(shared):
            more, twice = ok + 1, ok * 2
        assert enc.step([ok], more, [twice]) == [2, 3]
        enc.step([ok], ok, [bad])
        with pytest.raises(RuntimeError, match="out of memory"):
            enc.step([ok], ok, [])  # the last queue's error, before this job runs
        with pytest.raises(RuntimeError, match="no Stream"):  # this thread's own stream
            enc.step([ok + 1], ok, [])
    finally:
        enc.close()
    assert enc._ended.is_set() and enc._thread.is_alive()  # back in the pool, not ended


def test_a_closing_batch_logs_its_last_steps_failure(monkeypatch, caplog) -> None:
    """A batch closes once its rows are done; a failure of the step queued past their last
    tokens is logged, not raised into the engine's turn, and the encoder's thread ends."""
    from mlxd.engine.batch import BatchedRows

    bad = mx.array([9])

    def async_eval(*arrays: Any) -> None:
        if any(a is bad for a in arrays):
            raise RuntimeError("out of memory")
        mx.async_eval(*arrays)

    fake = SimpleNamespace(eval=mx.eval, async_eval=async_eval, array=mx.array)
    monkeypatch.setattr(overlap, "mx", fake)
    enc = StepEncoder()
    ok = mx.array([1, 2])
    assert enc.step([ok], ok, [bad]) == [1, 2]
    batch = SimpleNamespace(decode=SimpleNamespace(encoder=enc))
    BatchedRows._stop_encoder(batch)  # type: ignore[arg-type]
    assert batch.decode.encoder is None and enc._ended.is_set()
    assert "no row reads it" in caplog.text


def test_the_encoders_thread_outlives_its_batch() -> None:
    """A thread that ran MLX work and ended takes its thread-local streams and command encoders
    with it (and on the CPU can abort the process at exit, overlap.py): a closed encoder's
    thread goes back to the pool alive, and the next batch's encoder runs on a pooled thread,
    under the encoder's name only while it serves."""
    shared = overlap.stream()
    with mx.stream(shared):
        ok = mx.array([1, 2]) + 0
    first = StepEncoder()
    assert first.step([ok], ok, []) == [1, 2]
    first.close()
    time.sleep(0.05)  # the worker returns to the idle pool just after its job ends
    before = set(threading.enumerate())
    second = StepEncoder()
    try:
        assert second.step([ok], ok, []) == [1, 2]
        assert second._thread.name == overlap.NAME
    finally:
        second.close()
    assert first._thread.is_alive() and second._thread.is_alive()
    assert second._thread in before  # an idle pooled thread, taken again: none started
    assert second._thread.name != overlap.NAME


def test_a_joiners_prefill_waits_for_the_encoder(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlx-lm's BatchGenerator.next() steps the running rows, then prefills a joiner's chunk on
    the same stream: with the step's rest still being queued on the encoder's thread, both
    threads would be inside the stream's one command encoder (on MLX-CUDA with graphs on, its
    graph state). Each chunk's evaluation on the engine thread starts after the encoder's queue
    ends (here held 20 ms), and the rows get the default order's tokens and logprobs."""
    real_eval, real_async = mx.eval, mx.async_eval
    spans: list[tuple[float, float, str]] = []

    def timed(real: Callable[..., Any], hold: float) -> Callable[..., Any]:
        def call(*arrays: Any) -> Any:
            t0 = time.perf_counter()
            out = real(*arrays)
            who = threading.current_thread().name
            if who == overlap.NAME:
                time.sleep(hold)  # a long encode: the engine thread goes on meanwhile
            spans.append((t0, time.perf_counter(), who))
            return out

        return call

    model, tok = _load(tiny_model)
    eos = frozenset(tok.eos_token_ids)
    long = tok.encode(" ".join(TEXTS * 4))  # a joiner prefilled in several chunks

    def run(config: EngineConfig) -> list[list[tuple[int, Any]]]:
        reqs = [
            GenerationRequest(prompt=mx.array(tok.encode(t)), max_tokens=16, stop_token_ids=eos)
            for t in TEXTS
        ]
        engine = Engine(model, config=config)
        try:
            handles = engine.submit_many(reqs)
            first = iter(handles[0])
            head = [next(first) for _ in range(3)]
            late = engine.submit(GenerationRequest(prompt=mx.array(long), max_tokens=6))
            rows = [head + list(first)] + [list(h) for h in handles[1:]] + [list(late)]
        finally:
            engine.close()
        return [[(e.token, e.logprobs) for e in r] for r in rows]

    ref = run(EngineConfig(8, 8, 8))
    overlap.stream()  # made before the stand-ins below replace mx's calls
    monkeypatch.setattr(overlap, "mx", SimpleNamespace(
        eval=timed(real_eval, 0.0), async_eval=timed(real_async, 0.02), array=mx.array
    ))  # fmt: skip
    monkeypatch.setattr(mx, "eval", timed(real_eval, 0.0))
    monkeypatch.setattr(mx, "async_eval", timed(real_async, 0.0))
    got = run(EngineConfig(8, 8, 8, step_order="thread", thread_rows=1))
    assert_same_outputs(got, ref)
    encoder = [(a, b) for a, b, who in spans if who == overlap.NAME]
    engine = [(a, b) for a, b, who in spans if who == "mlxd-engine"]  # the loop's thread
    assert len(encoder) >= 10 and len(engine) >= len(long) // 8  # the joiner's chunks
    overlaps = [(e, q) for e in engine for q in encoder if e[0] < q[1] and q[0] < e[1]]
    assert overlaps == []
