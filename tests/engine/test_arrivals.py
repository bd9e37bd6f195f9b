"""The join window (engine/arrivals.py): a new wave waits, at most the window, for requests a
server is still building, so turns that arrive together join in one wave (the bits of
mlx-lm's batch of them all); a lone request never waits; running rows keep decoding."""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs

from mlxd.engine.arrivals import Arrivals
from mlxd.engine.engine import Engine
from mlxd.engine.prefix import PrefixSharing
from mlxd.engine.request import GenerationRequest, TokenEvent
from mlxd.store import PrefixStore

TEXTS = ["Hello there my friend", "Tell me a long story about a cat"]


@pytest.fixture(scope="module")
def loaded(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


@pytest.fixture
def engine_of(loaded) -> Iterator[Callable[[float], Engine]]:
    """`engine_of(window)`: an engine on the tiny model reading Arrivals(window), closed after."""
    made: list[Engine] = []

    def make(window: float) -> Engine:
        made.append(Engine(loaded[0], batch=8, arrivals=Arrivals(window)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def _req(tok, text: str, n: int = 8) -> GenerationRequest:
    return GenerationRequest(
        prompt=mx.array(tok.encode(text)), max_tokens=n, stop_token_ids=frozenset()
    )


def test_hold_lasts_while_tickets_are_out_and_at_most_the_window() -> None:
    a = Arrivals(0.5)
    now = time.perf_counter()
    assert a.hold(now) == 0.0  # nothing on its way
    with a.coming() as ticket:
        assert a.pending == 1
        assert 0.4 < a.hold(now) <= 0.5
        assert a.hold(now - 0.6) == 0.0  # the oldest waited the whole window
        assert a.hold(None) == 0.0  # nobody waits
        ticket.release()
        ticket.release()  # once only
        assert a.pending == 0
    assert a.pending == 0
    with pytest.raises(RuntimeError), a.coming():
        raise RuntimeError("the prompt did not build")
    assert a.pending == 0  # a failed build releases its ticket
    off = Arrivals(0.0)
    with off.coming():
        assert off.pending == 0 and off.hold(now) == 0.0  # window 0: off
    with pytest.raises(ValueError):
        Arrivals(-1.0)


def _assert_one_held_wave(loaded, engine: Engine, handles: list) -> None:
    """TEXTS' two rows joined one wave after one hold, with mlx-lm's batch's bits."""
    model, tok = loaded
    ref = batch_generator_outputs(model, [tok.encode(t) for t in TEXTS], 8, frozenset())
    got = [[(e.token, e.logprobs) for e in h] for h in handles]
    paths = engine.stats()["paths"]
    assert paths.get("serial", 0) == 0 and paths["batched"] == 2
    assert paths["wave held for arrivals"] == 1
    assert_same_outputs(got, ref)


def test_turns_on_their_way_join_one_wave_with_mlx_lms_bits(loaded, engine_of) -> None:
    tok = loaded[1]
    engine = engine_of(30.0)
    with engine.arrivals.coming() as first, engine.arrivals.coming() as second:
        h1 = engine.submit(_req(tok, TEXTS[0]), first)  # released as it queues
        time.sleep(0.3)
        assert h1.poll() is None and engine.stats()["waiting"] == 1  # held for the second
        h2 = engine.submit(_req(tok, TEXTS[1]), second)
    _assert_one_held_wave(loaded, engine, [h1, h2])


def test_a_ticket_never_released_holds_a_wave_only_for_the_window(loaded, engine_of) -> None:
    model, tok = loaded
    engine = engine_of(0.4)
    with engine.arrivals.coming():  # a request that never comes
        tic = time.perf_counter()
        handle = engine.submit(_req(tok, TEXTS[0], 2))
        first = next(iter(handle))
        waited = time.perf_counter() - tic
        assert isinstance(first, TokenEvent)
        assert 0.35 < waited < 10
        list(handle)
    assert engine.stats()["paths"]["wave held for arrivals"] == 1


def test_a_lone_request_is_never_held(loaded, engine_of) -> None:
    model, tok = loaded
    engine = engine_of(30.0)
    with engine.arrivals.coming() as ticket:
        handle = engine.submit(_req(tok, TEXTS[0], 4), ticket)
        assert engine.arrivals.pending == 0  # released before it queued
        assert len(list(handle)) == 4 and handle.done.reason == "length"
    assert "wave held for arrivals" not in engine.stats()["paths"]


def test_a_held_wave_on_free_rows_is_not_a_full_queue(loaded) -> None:
    """A burst's first wave waits in the queue while the window holds it, on rows that are
    free: batch + max_queue requests are taken, the next one is Overloaded."""
    from mlxd.engine import Overloaded

    tok = loaded[1]
    engine = Engine(loaded[0], batch=3, max_queue=2, arrivals=Arrivals(30.0))
    try:
        with engine.arrivals.coming():  # a request still on its way holds the wave
            handles = [engine.submit(_req(tok, f"turn {i}", 4)) for i in range(3 + 2)]
            assert engine.stats()["waiting"] == 5 and engine.stats()["active"] == 0
            with pytest.raises(Overloaded):
                engine.submit(_req(tok, "one too many", 4))
        for h in handles:
            assert len(list(h)) == 4 and h.done.reason == "length"
    finally:
        engine.close()


def test_running_rows_keep_decoding_while_a_wave_is_held(loaded, engine_of) -> None:
    model, tok = loaded
    engine = engine_of(30.0)
    running = engine.submit_many([_req(tok, t, 400) for t in TEXTS])
    next(iter(running[0]))  # decoding
    with engine.arrivals.coming() as ticket:
        late = engine.submit(_req(tok, "one two three", 4))
        before = engine.stats()["tokens_generated"]
        time.sleep(0.3)
        assert late.poll() is None and engine.stats()["waiting"] == 1
        assert engine.stats()["tokens_generated"] > before  # the batch did not stop
        ticket.release()
        assert len(list(late)) == 4
    for h in running:
        h.cancel()
        list(h)


def test_replies_that_ended_are_turns_expected_back() -> None:
    a = Arrivals(0.5)
    a.replied()
    a.replied()  # two agents' replies ended
    with a.coming():  # the first is back, built and queued
        pass
    now = time.perf_counter()
    assert a.pending == 0 and a.expected(now) == 1
    left = a.hold(now)  # nothing on its way, and still a turn expected: the window's rest
    assert 0.5 - (time.perf_counter() - now) <= left <= 0.5
    assert a.hold(now - 0.6) == 0.0  # at most the window
    with a.coming():
        assert a.expected(now) == 0  # the second is on its way (pending holds)
    assert a.hold(now) == 0.0  # both are back


def test_a_lone_agent_back_and_old_replies_never_hold() -> None:
    a = Arrivals(0.2)
    a.replied()
    with a.coming():
        pass
    assert a.hold(time.perf_counter()) == 0.0  # its one reply came back
    a.replied()
    time.sleep(0.5)  # a reply ended long before the next request
    with a.coming():
        pass
    assert a.expected(time.perf_counter()) == 0 and a.hold(time.perf_counter()) == 0.0
    assert len(a.ends) == 0 and len(a.comings) == 1  # two windows back are forgotten
    off = Arrivals(0.0)
    with off.coming() as ticket:
        ticket.replied()
    assert not off.ends and not off.maybe()  # window 0: nothing is counted


def test_an_ended_reply_holds_its_returning_turn_for_the_other(loaded, engine_of) -> None:
    tok = loaded[1]
    engine = engine_of(30.0)
    engine.arrivals.replied()
    engine.arrivals.replied()  # two turns are expected back
    with engine.arrivals.coming() as first:
        h1 = engine.submit(_req(tok, TEXTS[0]), first)
    time.sleep(0.3)
    assert h1.poll() is None and engine.stats()["waiting"] == 1  # held for the other turn
    with engine.arrivals.coming() as second:
        h2 = engine.submit(_req(tok, TEXTS[1]), second)
    _assert_one_held_wave(loaded, engine, [h1, h2])


def _stored(loaded, arrivals: Arrivals) -> Engine:
    return Engine(loaded[0], batch=8, arrivals=arrivals,
                  prefix_store=PrefixStore(max_entries=50), namespace="t")  # fmt: skip


SYSTEM_END = 100  # a server's system cut (`snapshot_at`), what the turns on their way share


def _long_req(prompt: list[int], cut: bool = True) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(prompt), max_tokens=4, stop_token_ids=frozenset(),
                             prefill_step_size=64,
                             snapshot_at=((SYSTEM_END, "system"),) if cut else ())  # fmt: skip


def _long(tok, tail: str = "") -> list[int]:
    long = tok.encode(" ".join(f"w{i}" for i in range(120))) + tok.encode(tail)
    assert len(long) > SYSTEM_END >= 64  # a prefill step (64 here) or more the store lacks
    return long


def test_a_long_prompt_the_store_lacks_starts_ahead_of_its_wave(loaded) -> None:
    """A fleet's new system prompt: nothing runs and the oldest request has a prefill step or
    more the store lacks, so it starts while its wave's other turns are still on their way
    (they would wait for its snapshot anyway). A turn the store serves is held as before."""
    tok = loaded[1]
    engine = _stored(loaded, Arrivals(30.0))
    try:
        long, req = _long(tok), _long_req

        with engine.arrivals.coming() as first, engine.arrivals.coming() as second:
            tic = time.perf_counter()
            lead = engine.submit(req(long), first)
            assert isinstance(next(iter(lead)), TokenEvent)  # `second` is still on its way
            assert time.perf_counter() - tic < 10  # not held for the 30 s window
            assert engine.stats()["paths"]["started ahead of its wave"] == 1
            list(lead)
            with engine.arrivals.coming():  # the next turn: the store serves all but 2 tokens
                back = engine.submit(req(long + tok.encode(" again")), second)
                time.sleep(0.3)
                assert back.poll() is None and engine.stats()["waiting"] == 1
            assert len(list(back)) == 4 and back.done.cached_tokens >= len(long)
        paths = engine.stats()["paths"]
        assert paths["wave held for arrivals"] == 1 and paths["started ahead of its wave"] == 1
    finally:
        engine.close()


def _held_with_its_wave(loaded, arrivals: Arrivals, cut: bool = True) -> dict:
    """A long prompt the store lacks, queued while another request is on its way: it waits
    with its wave (not started ahead), then runs. The engine's paths."""
    engine = _stored(loaded, arrivals)
    try:
        with engine.arrivals.coming() as first, engine.arrivals.coming():
            held = engine.submit(_long_req(_long(loaded[1]), cut=cut), first)
            time.sleep(0.3)
            assert held.poll() is None and engine.stats()["waiting"] == 1
        assert len(list(held)) == 4
        paths = engine.stats()["paths"]
    finally:
        engine.close()
    assert paths["wave held for arrivals"] == 1 and "started ahead of its wave" not in paths
    return paths


def test_a_long_prompt_with_no_cut_to_wait_for_is_held(loaded) -> None:
    """Without a boundary snapshot, turns on their way could not wait for its prefill and
    would compute the shared part again: so it waits with its wave, as before."""
    _held_with_its_wave(loaded, Arrivals(30.0), cut=False)


def test_a_failed_store_peek_holds_the_prompt_with_its_wave(loaded, monkeypatch, caplog) -> None:
    """The store failing to answer whether it has the prompt: the request waits with its wave
    as before the lead existed, the failure is logged, and the row still runs."""

    def broken(*_: object) -> int:
        raise RuntimeError("store down")

    monkeypatch.setattr(PrefixStore, "peek", broken)
    _held_with_its_wave(loaded, Arrivals(30.0))
    assert "prefix store peek failed" in caplog.text


def _fleet_turn(loaded, monkeypatch, window: float) -> tuple[list, dict]:
    """Three agents sharing a system prompt the store lacks (its cut where their prompts part):
    the first's request queues while the other two are still on their way. The first's system
    snapshot waits until the other two have queued, so they come while it is prefilling, as in
    a fleet whose prefill outlasts the others' tokenizing. `window` 0: no join window at all."""
    tok = loaded[1]
    prompts = [_long(tok, f" agent {i} asks") for i in range(3)]
    shared = next(i for i, (a, b) in enumerate(zip(*prompts[:2], strict=False)) if a != b)
    queued, snapshot = threading.Event(), PrefixSharing.snapshot

    def gated(self, req, plan, at, *rest, **kw):
        queued.wait(30)
        return snapshot(self, req, plan, at, *rest, **kw)

    monkeypatch.setattr(PrefixSharing, "snapshot", gated)
    engine = _stored(loaded, Arrivals(window))
    try:

        def req(prompt: list[int]) -> GenerationRequest:
            return GenerationRequest(prompt=mx.array(prompt), max_tokens=6,
                                     stop_token_ids=frozenset(), prefill_step_size=64,
                                     snapshot_at=((shared, "system"),))  # fmt: skip

        with engine.arrivals.coming() as t0, engine.arrivals.coming() as t1:
            with engine.arrivals.coming() as t2:
                first = engine.submit(req(prompts[0]), t0)
                time.sleep(0.3)  # started at once (its snapshot gated), not held for the others
                assert engine.stats()["waiting"] == 0
                later = zip(prompts[1:], (t1, t2), strict=True)
                rest = [engine.submit(req(p), t) for p, t in later]
        queued.set()
        got = [[(e.token, e.logprobs) for e in h] for h in [first, *rest]]
        assert [h.done.cached_tokens for h in rest] == [shared, shared]  # its snapshot served them
        return got, dict(engine.stats()["paths"])
    finally:
        engine.close()


def test_starting_ahead_keeps_the_rows_bits_and_the_shared_prefill(loaded, monkeypatch) -> None:
    """Started ahead of its held wave, the first agent prefills the system prompt alone and the
    others wait for its snapshot: the same rows as with no window, so the same tokens and
    logprobs, exactly."""
    ahead, ahead_paths = _fleet_turn(loaded, monkeypatch, 30.0)
    plain, plain_paths = _fleet_turn(loaded, monkeypatch, 0.0)
    assert ahead_paths["started ahead of its wave"] == 1
    assert "started ahead of its wave" not in plain_paths
    assert ahead_paths["serial->batched"] == plain_paths["serial->batched"] == 1
    assert_same_outputs(ahead, plain)
