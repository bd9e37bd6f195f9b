"""B=1: mlx-lm's `stream_generate` against mlxd's and its variants, alternated, warm or with
`mx.clear_cache()` (and `gc.collect()`) before every run, as `mlxd bench generate` does.

    python -m mlxd.bench.probe_fresh --shape qwen3-0.6b --rounds 50

Sides beside mlx-lm: mlxd (on the main thread its lone row's turns run there, drive.py); mlxd
with every token handed over by the engine thread (`mlxd hand-off`, the engine before drive.py);
that with a 0.5 ms GIL switch interval; mlxd's B=1 row driven on the caller's thread with no
engine; and the same row on one of mlxd's pooled threads, timed there. Figures: TTFT medians,
pooled per-token gaps (p10, p25, p50) against mlx-lm's and their ratio (mlx-lm's ms over the
side's: a speed ratio, > 1 when the side is faster), and the median per-round ratio.
`--memory` then runs each side once from a cleared cache and prints MLX's reserved memory
(active + cached) at tokens 1, 2, 4, ...: how many new buffers each side's decode takes.
H200 results: docs/performance.md §4 item 8.
"""

import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate

from ..engine import stream_generate as mlxd_stream_generate
from ..engine.engine import Engine
from ..engine.request import GenerationRequest
from ..engine.serial import SerialRow
from ..engine.threads import run_on_worker
from .models import build_random, stream_parser


def _mlxd_handoff(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """mlxd's stream_generate with every token made on the engine thread and handed over."""
    Engine.drivable = False
    try:
        yield from mlxd_stream_generate(*args, **kwargs)
    finally:
        Engine.drivable = True


def _mlxd_switch(*args: Any, **kwargs: Any) -> Iterator[Any]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        yield from _mlxd_handoff(*args, **kwargs)
    finally:
        sys.setswitchinterval(before)


def _serial_here(model: Any, _tok: Any, prompt: mx.array, max_tokens: int) -> Iterator[int]:
    """mlxd's B=1 row on the caller's thread: no engine, no hand-off."""
    from mlx_lm.generate import generation_stream

    req = GenerationRequest(prompt=prompt, max_tokens=max_tokens)
    row = SerialRow(model, req, generation_stream)
    while row.prefilling:
        row.prefill_chunk()
    while (step := row.decode()) is not None:
        yield step.token


def _serial_worker(model: Any, tok: Any, prompt: mx.array, max_tokens: int) -> Iterator[float]:
    """The same, on one of mlxd's pooled engine threads, timed there: a thread, no hand-off.
    Yields that thread's per-token stamps once the row has ended."""
    stamps: list[float] = []
    done = threading.Event()

    def job() -> None:
        stamps.extend(time.perf_counter() for _ in _serial_here(model, tok, prompt, max_tokens))

    run_on_worker(job, done)
    done.wait()
    yield from stamps


SIDES: dict[str, Callable] = {
    "mlx-lm": stream_generate,
    "mlxd": mlxd_stream_generate,
    "mlxd hand-off": _mlxd_handoff,
    "mlxd hand-off, switch 0.5ms": _mlxd_switch,
    "serial row here": _serial_here,
    "serial row on a worker": _serial_worker,
}


def _gaps(fn: Callable, bm, prompt: mx.array, n: int, fresh: bool) -> tuple[float, list[float]]:
    """(TTFT ms, per-token gaps ms) of one run."""
    if fresh:  # bench generate's _fresh()
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
    t0 = time.perf_counter()
    run = fn(bm.model, bm.tokenizer, prompt, max_tokens=n)
    # The worker side yields its own stamps, taken on the worker as each token came.
    stamps = list(run) if fn is _serial_worker else [time.perf_counter() for _ in run]
    return 1e3 * (stamps[0] - t0), [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]


def _q(v: list[float], p: float) -> float:
    return sorted(v)[int(len(v) * p)]


def run(
    shape: str, rounds: int, prompt_tokens: int, gen: int, sides: list[str], conditions: list[bool]
) -> list[str]:
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    lines = []
    for fresh in conditions:
        for k in sides:  # warm-up
            _gaps(SIDES[k], bm, prompt, gen, fresh)
        pooled: dict[str, list[float]] = {k: [] for k in sides}
        medians: dict[str, list[float]] = {k: [] for k in sides}
        ttft: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(rounds):
            for k in sides[:: 1 if r % 2 == 0 else -1]:
                first, gaps = _gaps(SIDES[k], bm, prompt, gen, fresh)
                pooled[k] += gaps
                medians[k].append(statistics.median(gaps))
                ttft[k].append(first)
        lines.append(
            f"fresh={fresh}, TTFT ms median: "
            + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in ttft.items())
        )
        a = pooled["mlx-lm"]
        for side in sides[1:]:
            b = pooled[side]
            qs = " ".join(
                f"p{int(100 * p)} {_q(a, p):.3f}/{_q(b, p):.3f} ({_q(a, p) / _q(b, p):.3f})"
                for p in (0.1, 0.25, 0.5)
            )
            pairs = zip(medians["mlx-lm"], medians[side], strict=True)
            per = statistics.median(x / y for x, y in pairs)
            lines.append(
                f"fresh={fresh}, {side}: pooled ms mlx-lm/it {qs}; per-round ratio {per:.3f}"
            )
    return lines


def memory(shape: str, prompt_tokens: int, gen: int, sides: list[str]) -> list[str]:
    """Reserved MB (active + cache) as each token arrives, from a cleared cache."""
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    marks = [1 << k for k in range(gen.bit_length()) if 1 << k <= gen]
    lines = []
    for name in [*sides, *sides]:  # twice: the first pass compiles
        fn = SIDES[name]
        gc.collect()
        mx.clear_cache()
        mb = [
            (mx.get_active_memory() + mx.get_cache_memory()) / 1e6
            for _ in fn(bm.model, bm.tokenizer, prompt, max_tokens=gen)
        ]
        got = " ".join(f"{m}:{mb[m - 1]:.1f}" for m in marks if m <= len(mb))
        lines.append(f"{name:12s} reserved MB at token {got}")
    return lines[len(sides) :]


def main(argv: list[str] | None = None) -> None:
    p = stream_parser(__doc__, rounds=40, prompt_tokens=512, gen_tokens=128)
    p.add_argument("--memory", action="store_true", help="also print reserved memory per token")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated; mlx-lm first")
    p.add_argument("--fresh", default="warm,cold", help="warm, cold or both (comma-separated)")
    a = p.parse_args(argv)
    sides = ["mlx-lm", *[s for s in a.sides.split(",") if s and s != "mlx-lm"]]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        p.error(f"unknown sides {unknown}; known: {list(SIDES)}")
    if not set(a.fresh.split(",")) <= {"warm", "cold"}:
        p.error("--fresh takes warm, cold or warm,cold")
    conditions = [c == "cold" for c in a.fresh.split(",")]
    lines = run(a.shape, a.rounds, a.prompt_tokens, a.gen_tokens, sides, conditions)
    print("\n".join(lines), flush=True)
    if a.memory:  # the worker side hands its tokens over only at the end: nothing to read
        per_token = [s for s in sides if SIDES[s] is not _serial_worker]
        print("\n".join(memory(a.shape, a.prompt_tokens, a.gen_tokens, per_token)), flush=True)


if __name__ == "__main__":
    main()
