"""`--switch-interval engine` (engine/overlap.py): the batched step sets the GIL's switch interval
long while it builds its graph and short from its device waits on, and keeps mlx-lm's bits."""

import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs, batch_generator_outputs
from mlx_lm.sample_utils import make_logits_processors

from mlxd.config import EngineConfig
from mlxd.engine.decode_step import BiasedGenerationBatch
from mlxd.engine.engine import Engine
from mlxd.engine.overlap import StepPhases, step_phases
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams

TEXTS = ["Hello there my friend", "Tell me a long story about a cat", "x", "one two three"]
PHASES = StepPhases(build_s=0.0042, wait_s=0.00031)  # values no default has


@pytest.fixture
def interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("bias", [None, {17: 30.0, 42: 12.0}])
def test_phased_step_keeps_mlx_lms_bits_and_switches_by_phase(
    tiny_model: Callable[..., Path], monkeypatch, interval, bias
) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    ref = batch_generator_outputs(model, prompts, 8, eos, [make_logits_processors(bias)] * 4)
    seen: list[float] = []  # the interval while the step's graph is built (after the forward)
    readouts = BiasedGenerationBatch._readouts

    def spying(self, sampled, logprobs):
        seen.append(sys.getswitchinterval())
        return readouts(self, sampled, logprobs)

    monkeypatch.setattr(BiasedGenerationBatch, "_readouts", spying)
    engine = Engine(model, EngineConfig(8, 8, 2048), phases=PHASES)
    try:
        reqs = [
            GenerationRequest(
                prompt=mx.array(p),
                max_tokens=8,
                stop_token_ids=eos,
                sampling=SamplingParams(logit_bias=bias),
            )
            for p in prompts
        ]
        got = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
    finally:
        engine.close()
    assert_same_outputs(got, ref)
    assert len(seen) >= 7 and all(s == pytest.approx(PHASES.build_s) for s in seen)
    assert sys.getswitchinterval() == pytest.approx(PHASES.wait_s)  # the last step's waits


def test_step_phases_only_when_asked(interval) -> None:
    sys.setswitchinterval(0.003)
    assert step_phases(True) == StepPhases(build_s=pytest.approx(0.003))
    assert step_phases(False) is None


def test_a_lone_row_decodes_under_the_short_interval_with_generate_steps_bits(
    tiny_model: Callable[..., Path], monkeypatch, interval
) -> None:
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxd.engine.serial import SerialRow

    model, tok = load(str(tiny_model("qwen3")))
    prompt = tok.encode(TEXTS[1])
    ref = [(t, lp) for t, lp in generate_step(mx.array(prompt), model, max_tokens=8)]
    seen: list[float] = []  # the interval at each of the lone row's decode calls
    decode = SerialRow.decode

    def spying(self):
        seen.append(sys.getswitchinterval())
        return decode(self)

    monkeypatch.setattr(SerialRow, "decode", spying)
    sys.setswitchinterval(PHASES.build_s)  # as a batched step's build leaves it
    engine = Engine(model, EngineConfig(8, 8, 2048), phases=PHASES)
    try:
        (handle,) = engine.submit_many([GenerationRequest(prompt=mx.array(prompt), max_tokens=8)])
        got = [(e.token, e.logprobs) for e in handle]
    finally:
        engine.close()
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, ref, strict=True))
    assert len(seen) >= 7 and all(s == pytest.approx(PHASES.wait_s) for s in seen)


def test_held_wake_wakes_once_and_never_holds_two_steps() -> None:
    import asyncio

    from mlxd.engine.overlap import HeldWake

    loop = asyncio.new_event_loop()
    try:
        flags = [asyncio.Event() for _ in range(3)]
        held = HeldWake()
        held.hold([(loop, flags[0])])
        held.release()
        held.release()  # nothing left: no second call
        held.hold([(loop, flags[1])])
        held.hold([(loop, flags[2])])  # the first still held: woken now, not dropped
        loop.run_until_complete(asyncio.sleep(0))
        assert [f.is_set() for f in flags] == [True, True, False]
        held.release()
        loop.run_until_complete(asyncio.sleep(0))
        assert flags[2].is_set()
    finally:
        loop.close()


def test_readers_are_woken_as_the_next_step_is_queued(
    tiny_model: Callable[..., Path], monkeypatch, interval
) -> None:
    """With the engine's phases, async readers of a batched step's tokens are woken inside the
    next step (after its build, before its queue), not between turns; every token arrives, with
    the bits of the same engine without phases."""
    import asyncio

    from mlx_lm import load

    from mlxd.engine import overlap

    model, tok = load(str(tiny_model("qwen3")))
    eos = frozenset(tok.eos_token_ids)
    prompts = [tok.encode(t) for t in TEXTS]
    inside: list[bool] = [False]  # the engine thread is inside a batched step
    wakes: list[bool] = []  # for each held wake-up: was it inside a step?
    step = BiasedGenerationBatch._processed_step

    def stepping(self):
        inside[0] = True
        try:
            return step(self)
        finally:
            inside[0] = False

    def waking(watchers):
        wakes.append(inside[0])
        return real_wake(watchers)

    real_wake = overlap.wake
    monkeypatch.setattr(BiasedGenerationBatch, "_processed_step", stepping)
    monkeypatch.setattr(overlap, "wake", waking)

    def read(phases: StepPhases | None, own=None) -> list[list[tuple[int, mx.array]]]:
        engine = Engine(model, EngineConfig(8, 8, 2048), phases=phases)
        reqs = [
            GenerationRequest(
                prompt=mx.array(p), max_tokens=12, stop_token_ids=eos, logits_processors=own
            )
            for p in prompts
        ]

        async def drain(handle) -> list[tuple[int, mx.array]]:
            return [(e.token, e.logprobs) async for e in handle]

        async def main():
            handles = engine.submit_many(reqs)
            return await asyncio.gather(*(drain(h) for h in handles))

        try:
            return asyncio.run(main())
        finally:
            engine.close()

    plain = read(None)
    assert wakes == []  # no phases: every wake-up at once, none held
    got = read(StepPhases(build_s=0.0042, wait_s=0.00031))
    assert_same_outputs(got, plain)
    assert all(len(h) == 12 for h in got)
    assert len(wakes) >= 8 and all(wakes)  # each held wake-up went out inside the next step
    wakes.clear()  # a caller's own processor: mlx-lm's step, the readers woken as it starts

    def own(tokens, logits):
        return logits

    assert_same_outputs(read(StepPhases(0.0042, 0.00031), [own]), read(None, [own]))
    assert len(wakes) >= 8 and all(wakes)
