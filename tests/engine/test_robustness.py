"""50 requests with random arrival times, lengths, parameters, stops and cancellations.

With `batch=1` (strict serial) every finished request must equal its solo mlx-lm run; under
batching every request must end with a consistent reason and count, and memory must return
to its baseline."""

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.memory import settled_active_memory
from mlx_lm.generate import generate_step

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams

N = 50  # 8 batched rows stay full through joins, cancels and mixed prefill sizes


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))[0]


def _spec(rng: random.Random, i: int) -> dict:
    sampled = rng.random() < 0.5
    return {
        "prompt": [rng.randrange(1, 150_000) for _ in range(rng.randint(1, 40))],
        "max_tokens": rng.randint(1, 16),
        "params": SamplingParams(temp=rng.choice([0.7, 1.0]), top_k=rng.choice([0, 20]))
        if sampled
        else None,
        "seed": rng.randrange(1 << 31) if sampled else None,
        "prefill_step_size": rng.choice([4, 16, 2048]),
        "delay": rng.random() * 0.05,
        "cancel_after": rng.randint(0, 2) if rng.random() < 0.15 else None,
    }


def _request(s: dict) -> GenerationRequest:
    return GenerationRequest(
        prompt=mx.array(s["prompt"]),
        max_tokens=s["max_tokens"],
        sampling=s["params"],
        seed=s["seed"],
        prefill_step_size=s["prefill_step_size"],
    )


def _reference(model, s: dict) -> list[int]:
    if s["seed"] is not None:
        mx.random.seed(s["seed"])
    sampler = s["params"].sampler() if s["params"] else None
    steps = generate_step(
        mx.array(s["prompt"]),
        model,
        max_tokens=s["max_tokens"],
        sampler=sampler,
        prefill_step_size=s["prefill_step_size"],
    )
    return [t for t, _ in steps]


def _run(engine: Engine, specs: list[dict]) -> list[tuple[list[int], str]]:
    results: list = [None] * len(specs)

    def client(i: int) -> None:
        time.sleep(specs[i]["delay"])
        handle = engine.submit(_request(specs[i]))
        tokens = []
        for e in handle:
            tokens.append(e.token)
            if specs[i]["cancel_after"] is not None and len(tokens) > specs[i]["cancel_after"]:
                handle.cancel()
        done = handle.wait()
        results[i] = (tokens, done.reason)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results


def _nothing_left(engine: Engine, baseline: int) -> None:
    stats = engine.stats()
    assert stats["active"] == stats["waiting"] == 0
    assert settled_active_memory() <= baseline + 64 * 1024


@pytest.mark.parametrize("batch", [1, 8], ids=["serial", "batched"])
def test_random_load(model, batch: int) -> None:
    rng = random.Random(batch)
    specs = [_spec(rng, i) for i in range(N)]
    engine = Engine(model, batch=batch)
    try:
        # Warm up on the paths the run takes (a batch's one-time buffers are not a leak), then
        # measure the baseline: what 50 more requests leave behind must be nothing.
        _run(engine, [dict(s, delay=0.0) for s in specs[:8]])
        baseline = settled_active_memory()
        results = _run(engine, specs)
        for s, (tokens, reason) in zip(specs, results, strict=True):
            assert reason in {"length", "cancelled"}  # no EOS ids given: only these end rows
            if reason == "length":
                assert len(tokens) == s["max_tokens"]
            else:  # a cancelled row stops early and its tokens so far are still right
                assert s["cancel_after"] is not None and len(tokens) < s["max_tokens"]
            if batch == 1:
                assert tokens == _reference(model, s)[: len(tokens)]
        _nothing_left(engine, baseline)
    finally:
        engine.close()


def test_a_failure_while_starting_rows_ends_them(model, monkeypatch) -> None:
    """Joiners taken from the queue but not yet rows when admission fails get the error (they
    used to wait forever); the engine then serves the next requests."""
    from mlxd.engine import batch

    e = Engine(model, batch=4)
    try:
        real = batch.BatchedRows.insert
        calls = {"n": 0}

        def fail_once(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("insert failed")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(batch.BatchedRows, "insert", fail_once)
        reqs = [GenerationRequest(prompt=mx.array([5, 6, 7 + i]), max_tokens=3) for i in range(2)]
        handles = e.submit_many(reqs)
        errors: list[BaseException] = []

        def consume() -> None:
            for h in handles:
                try:
                    list(h)
                except RuntimeError as err:
                    errors.append(err)

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive(), "a taken request never ended"
        assert [str(err) for err in errors] == ["insert failed"] * 2
        again = e.submit_many([GenerationRequest(prompt=mx.array([9, 9]), max_tokens=2)] * 2)
        assert [len(list(h)) for h in again] == [2, 2]
    finally:
        e.close()


def _driven(engine: Engine, s: dict) -> tuple[bool, list[int], str]:
    """One request read on this (the main) thread: (driven at first?, tokens, reason)."""
    handle = engine.submit_driven(_request(s))
    driven = engine.driver.handle is handle
    tokens = []
    for e in engine.drive(handle):
        tokens.append(e.token)
        if s["cancel_after"] is not None and len(tokens) > s["cancel_after"]:
            handle.cancel()
    assert handle.done is not None and engine.driver.handle is not handle
    return driven, tokens, handle.done.reason


def test_random_load_while_the_main_thread_drives(model) -> None:
    """`batch=1`: the main thread reads requests of its own (driven whenever it finds the engine
    idle, engine/driver.py) before, while and after 25 others arrive from threads (enough to
    keep it busy meanwhile; test_random_load[serial] checks N). Every one of them equals its
    solo mlx-lm run, and nothing is left running."""
    rng = random.Random(15)
    specs = [_spec(rng, i) for i in range(N // 2)]
    mine = [_spec(rng, i) for i in range(12)]
    engine = Engine(model, batch=1)
    try:
        list(engine.submit(_request(specs[0])))
        baseline = settled_active_memory()
        out: list = []
        background = threading.Thread(target=lambda: out.append(_run(engine, specs)))
        driven = 0
        for i, s in enumerate(mine):
            if i == 4:
                background.start()  # the next ones mostly find the engine busy
            if i == 8:
                background.join(timeout=600)  # and these find it idle again
            time.sleep(s["delay"])
            was_driven, tokens, reason = _driven(engine, s)
            driven += was_driven
            assert tokens == _reference(model, s)[: len(tokens)]
            if reason == "length":
                assert len(tokens) == s["max_tokens"]
            else:
                assert reason == "cancelled" and s["cancel_after"] is not None
        assert driven >= 8  # the idle engine was driven before and after the load
        for s, (tokens, reason) in zip(specs, out[0], strict=True):
            assert reason in {"length", "cancelled"}
            assert tokens == _reference(model, s)[: len(tokens)]
        _nothing_left(engine, baseline)
    finally:
        engine.close()
