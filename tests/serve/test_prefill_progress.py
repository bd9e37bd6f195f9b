"""A request's `prompt_progress_callback` on the batched engine path: rows prefilled together
report each chunk over their whole prompt, as a serial row does (the request log's prefill
progress rides on it)."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest


def test_batched_rows_report_prefill_progress(tiny_model: Callable[..., Path]) -> None:
    from mlx_lm import load

    model, _ = load(str(tiny_model("qwen3")))
    step, lengths = 8, (30, 21)
    reports: list[list[tuple[int, int]]] = [[] for _ in lengths]
    reqs = [
        GenerationRequest(
            prompt=mx.array([(7 * i + 3) % 100 + 1 for i in range(n)]),
            max_tokens=2,
            prefill_step_size=step,
            prompt_progress_callback=lambda d, t, seen=seen: seen.append((d, t)),
        )
        for n, seen in zip(lengths, reports, strict=True)
    ]
    config = EngineConfig(batch=2, prefill_step_size=step)
    engine = Engine(model, config, serial_fast_path=False)
    try:
        for handle in engine.submit_many(reqs):
            handle.wait()
        assert engine.paths == {"batched": 2}
    finally:
        engine.close()
    for n, seen in zip(lengths, reports, strict=True):
        # mlx-lm's chunks: `step` tokens while more than one is left, the last one at the join
        chunks = [(min(d, n - 1), n) for d in range(step, n - 1 + step, step)]
        assert seen == [*dict.fromkeys(chunks), (n, n)]
