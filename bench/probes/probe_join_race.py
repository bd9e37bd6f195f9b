"""Rows joining while the running rows step on the encoder's thread (`--step-order thread`),
cycle after cycle: with CUDA graphs on, a server crashed at such a join. `--unsettled` puts
back the path that crashed (the engine thread prefills the joiners right after the
step's hand-over, while the encoder may still be queueing the step on the same stream), to
tell whether that path is what crashes. Run each way in a process of its own and read its exit
status; a line per cycle is flushed, so a crash shows how far it got.

    MLX_USE_CUDA_GRAPHS=1 python -m bench.probes.probe_join_race --shape qwen3-0.6b --cycles 20
"""

import argparse
import faulthandler
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxd.bench.models import build_random
from mlxd.config import THREAD_ROWS, EngineConfig
from mlxd.engine import batch
from mlxd.engine import rows as engine_rows
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model.folded_attention import MODES, is_fused
from mlxd.model.fused_projections import stack_in_place

RACES = [0]  # steps handed to the encoder with a prefill after them in the same next()


def _count(unsettled: bool, rows: int) -> Callable[[], None]:
    """Count the steps at risk; `unsettled`: the engine that crashed (no wait after the
    hand-over, a turn 'decode only' while a prompt batch still has chunks). Returns the undo."""
    real = batch.evaluates_after_step

    def after(gen: Any) -> bool:
        at_risk = real(gen)
        RACES[0] += at_risk and len(gen._generation_batch) >= rows
        return at_risk and not unsettled

    def undo() -> None:
        batch.evaluates_after_step = engine_rows.evaluates_after_step = real

    batch.evaluates_after_step = after  # type: ignore[assignment]
    if unsettled:
        engine_rows.evaluates_after_step = lambda gen: bool(gen._unprocessed_sequences)  # type: ignore
    return undo


def _prompt(rng: random.Random, n: int, vocab: int) -> mx.array:
    return mx.array([rng.randrange(1, vocab) for _ in range(n)])


def cycle(engine: Engine, rng: random.Random, vocab: int, a: argparse.Namespace) -> int:
    """`a.running` rows decode; after the first's 4th token `a.joining` long prompts join."""
    running = [
        engine.submit(GenerationRequest(prompt=_prompt(rng, a.short, vocab), max_tokens=a.gen))
        for _ in range(a.running)
    ]
    first = iter(running[0])
    head = [next(first) for _ in range(4)]
    joining = [
        engine.submit(GenerationRequest(prompt=_prompt(rng, a.long, vocab), max_tokens=a.gen // 2))
        for _ in range(a.joining)
    ]
    tokens = len(head) + len(list(first))
    return tokens + sum(len(list(h)) for h in [*running[1:], *joining])


def _run(a: argparse.Namespace, mode: str) -> None:
    bm = build_random(a.shape, "bfloat16")
    if is_fused(a.attention):
        stack_in_place(bm.model)
    rows = a.running + a.joining
    config = EngineConfig(
        rows, 8, a.step_size, attention=a.attention, clear_cache=False,
        step_order="thread", thread_rows=THREAD_ROWS,
    )  # fmt: skip
    engine = Engine(bm.model, config)
    rng = random.Random(0)
    try:
        for c in range(a.cycles):
            tic = time.perf_counter()
            n = cycle(engine, rng, bm.vocab_size, a)
            paths = engine.stats().get("paths", {})
            print(
                f"{mode} cycle {c}: {n} tokens in {time.perf_counter() - tic:.2f} s, "
                f"steps at risk {RACES[0]} {paths}"
            )
            sys.stdout.flush()
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--attention", choices=MODES, default="folded+fused")
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--running", type=int, default=24)
    p.add_argument("--joining", type=int, default=8)
    p.add_argument("--short", type=int, default=300, help="the running rows' prompt tokens")
    p.add_argument("--long", type=int, default=3000, help="a joiner's prompt tokens (chunks)")
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--step-size", type=int, default=2048)
    p.add_argument(
        "--unsettled",
        action="store_true",
        help="the joiners prefilled right after the hand-over (the path that crashed)",
    )
    a = p.parse_args(argv)
    try:
        faulthandler.enable(all_threads=True)  # a native crash prints each thread's stack
    except (AttributeError, ValueError, OSError):  # a stderr without a file (a test's capture)
        pass
    mode = "unsettled" if a.unsettled else "settled"
    RACES[0] = 0
    undo = _count(a.unsettled, THREAD_ROWS)
    try:
        _run(a, mode)
    finally:
        undo()
    print(f"{mode}: {a.cycles} cycles done")


if __name__ == "__main__":
    main()
