"""Prompt waves under a token budget: more joiners prefill together than the row count while
rows x the longest chunk fits, with BatchGenerator's bits at that composition."""

from collections import deque
from types import SimpleNamespace

import mlx.core as mx
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from mlx_lm.generate import PromptProcessingBatch

from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.prefill import wave_budget, wave_rows
from mlxd.engine.request import GenerationRequest


def _gen(processing: list[int], queued: list[int], step: int = 100) -> SimpleNamespace:
    """A BatchGenerator's queue as wave_rows reads it: first-segment lengths per row."""
    return SimpleNamespace(
        prefill_step_size=step,
        _currently_processing=[[[[0] * n, [0]], 0, n + 1] for n in processing],
        _unprocessed_sequences=deque((uid, [[0] * n, [0]]) for uid, n in enumerate(queued)),
    )


def test_rows_join_while_rows_times_the_longest_chunk_fits() -> None:
    assert wave_rows(_gen([], [10] * 12), floor=4, budget=100) == 10  # 10 x 10
    assert wave_rows(_gen([], [10, 10, 60, 10]), floor=1, budget=130) == 2  # 3 x 60 > 130
    assert wave_rows(_gen([30], [10, 10]), floor=1, budget=90) == 3  # the running row's 30
    assert wave_rows(_gen([], [500, 500]), floor=1, budget=150) == 1  # chunks cap at the step
    assert wave_rows(_gen([], [90] * 8), floor=4, budget=100) == 4  # never below mlx-lm's count
    assert wave_rows(_gen([], []), floor=8, budget=10_000) == 8


def test_budget_flag() -> None:
    assert wave_budget(0, 8, 2048) is None
    assert wave_budget(-1, 8, 2048) == 8 * 2048
    assert wave_budget(5000, 8, 2048) == 5000


@pytest.mark.parametrize("budget", [2 * 2048, None])
def test_a_budgeted_wave_equals_batch_generator_at_its_composition(
    tiny_model, monkeypatch: pytest.MonkeyPatch, budget: int | None
) -> None:
    """Six prompts with a row count of 2 prefill in one wave under the budget (in waves of two
    without it): tokens and logprob arrays equal BatchGenerator's at that composition."""
    from mlx_lm import load

    waves: list[int] = []  # rows per prefill call, spied on mlx-lm's prompt batch
    prompt = PromptProcessingBatch.prompt

    def spy(self, tokens):
        waves.append(len(tokens))
        return prompt(self, tokens)

    monkeypatch.setattr(PromptProcessingBatch, "prompt", spy)

    model, tok = load(str(tiny_model("qwen3")))
    prompts = [tok.encode(f"agent {i} says: " + "word " * (3 + 2 * i)) for i in range(6)]
    eos = frozenset(tok.eos_token_ids)
    rows = 6 if budget else 2
    expected = batch_generator_outputs(model, prompts, 8, eos, prefill_batch_size=rows)
    assert [w for w in waves if w] == [rows] * (6 // rows)
    waves.clear()
    config = EngineConfig(6, 2, 2048, prefill_tokens=budget)
    engine = Engine(model, batch=6, config=config)
    try:
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=8, stop_token_ids=eos) for p in prompts
        ]
        handles = engine.submit_many(reqs)
        for handle, ref in zip(handles, expected, strict=True):
            got = [(e.token, e.logprobs) for e in handle]
            assert [t for t, _ in got] == [t for t, _ in ref]
            assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, ref, strict=True))
        assert [w for w in waves if w] == [rows] * (6 // rows)
    finally:
        engine.close()


def _drive(
    model, first: list[list[int]], later: list[list[int]], hold: bool, at: int = 1
) -> list[list[int]]:
    """BatchGenerator with mlxd's kept-buffers prompt batch: `first` inserted, `later` at step
    `at`; stepped to the end with `wave_size` (hold) or mlx-lm's fixed count. Tokens per row."""
    from mlx_lm.generate import BatchGenerator

    from mlxd.engine.prefill import keep_buffers, wave_size

    gen = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    keep_buffers(gen)
    uids = gen.insert(first, max_tokens=[4] * len(first))
    out: dict[int, list[int]] = {}
    for step in range(40):
        if step == at:
            uids += gen.insert(later, max_tokens=[4] * len(later))
        if hold and gen._unprocessed_sequences:
            gen.prefill_batch_size = wave_size(gen, 8, None)
        for r in gen.next()[1]:
            out.setdefault(r.uid, []).append(r.token)
    gen.close()
    return [out[u] for u in uids]


def test_a_wave_moves_whole_before_later_rows_join(tiny_model, monkeypatch) -> None:
    """Rows arriving while a wave has only its last tokens left wait one step, so the wave moves
    to decoding as it is; joined first, mlx-lm splits it (a deep copy and a gather of every
    row). The tokens are BatchGenerator's with the later rows inserted a step later."""
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    splits: list[int] = []
    split = PromptProcessingBatch.split
    monkeypatch.setattr(
        PromptProcessingBatch, "split", lambda b, i: (splits.append(len(i)), split(b, i))[1]
    )
    first = [tok.encode(t) for t in ("the first wave of rows", "a second row of it here")]
    later = [tok.encode(t) for t in ("later rows", "arrive a step after")]
    held = _drive(model, first, later, hold=True)
    assert splits == [] and all(len(t) == 4 for t in held)
    _drive(model, first, later, hold=False)
    assert splits == [2]  # without the hold, the wave's move is mlx-lm's partial split
    assert held == _drive(model, first, later, hold=False, at=2)  # the oracle: inserted later
