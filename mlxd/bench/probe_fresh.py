"""B=1 and the buffer cache: mlx-lm's `stream_generate` against mlxd's, alternated, with and
without `mx.clear_cache()` (and `gc.collect()`) before every run, as `mlxd bench generate`
does before each of its runs. Session 14 on the H200: mlxd's decode speed ratio was 0.976
without the clear and 0.907 with it (docs/performance.md §4 item 8).

    python -m mlxd.bench.probe_fresh --shape qwen3-0.6b --rounds 50

Figures, for mlxd and for mlxd whose B=1 row keeps its last two logprob vectors (freed on the
engine thread): pooled per-token gaps (p10, p25, p50) against mlx-lm's and their ratio (mlx-lm's
ms over mlxd's: a speed ratio, > 1 when mlxd is faster), and the median per-round ratio.
`--memory` then runs each side once from a cleared cache and prints MLX's reserved memory
(active + cached) at tokens 1, 2, 4, ...: how many new buffers each side's decode takes.
"""

import gc
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate

from ..engine import stream_generate as mlxd_stream_generate
from ..engine.serial import SerialRow
from .models import build_random, stream_parser


def _mlxd_keeping(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """mlxd's stream_generate with its B=1 row holding its last two logprob vectors, so they
    are freed on the engine thread (SerialRow.keeps; the candidate of §4 item 8)."""
    SerialRow.keeps = 2
    try:
        yield from mlxd_stream_generate(*args, **kwargs)
    finally:
        SerialRow.keeps = 0


SIDES: dict[str, Callable] = {
    "mlx-lm": stream_generate,
    "mlxd": mlxd_stream_generate,
    "mlxd keeps 2": _mlxd_keeping,
}


def _gaps(fn: Callable, bm, prompt: mx.array, n: int, fresh: bool) -> list[float]:
    if fresh:  # bench generate's _fresh()
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
    stamps = [time.perf_counter() for _ in fn(bm.model, bm.tokenizer, prompt, max_tokens=n)]
    return [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]


def _q(v: list[float], p: float) -> float:
    return sorted(v)[int(len(v) * p)]


def run(shape: str, rounds: int, prompt_tokens: int, gen: int) -> list[str]:
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    lines = []
    for fresh in (False, True):
        for fn in SIDES.values():  # warm-up
            _gaps(fn, bm, prompt, gen, fresh)
        pooled: dict[str, list[float]] = {k: [] for k in SIDES}
        medians: dict[str, list[float]] = {k: [] for k in SIDES}
        for r in range(rounds):
            for k in list(SIDES)[:: 1 if r % 2 == 0 else -1]:
                gaps = _gaps(SIDES[k], bm, prompt, gen, fresh)
                pooled[k] += gaps
                medians[k].append(statistics.median(gaps))
        a = pooled["mlx-lm"]
        for side in list(SIDES)[1:]:
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


def memory(shape: str, prompt_tokens: int, gen: int) -> list[str]:
    """Reserved MB (active + cache) as each token arrives, from a cleared cache."""
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    marks = [1 << k for k in range(gen.bit_length()) if 1 << k <= gen]
    lines = []
    for name, fn in [*SIDES.items(), *SIDES.items()]:  # twice: the first pass compiles
        gc.collect()
        mx.clear_cache()
        mb = [
            (mx.get_active_memory() + mx.get_cache_memory()) / 1e6
            for _ in fn(bm.model, bm.tokenizer, prompt, max_tokens=gen)
        ]
        got = " ".join(f"{m}:{mb[m - 1]:.1f}" for m in marks if m <= len(mb))
        lines.append(f"{name:12s} reserved MB at token {got}")
    return lines[len(SIDES) :]


def main(argv: list[str] | None = None) -> None:
    p = stream_parser(__doc__, rounds=40, prompt_tokens=512, gen_tokens=128)
    p.add_argument("--memory", action="store_true", help="also print reserved memory per token")
    a = p.parse_args(argv)
    print("\n".join(run(a.shape, a.rounds, a.prompt_tokens, a.gen_tokens)), flush=True)
    if a.memory:
        print("\n".join(memory(a.shape, a.prompt_tokens, a.gen_tokens)), flush=True)


if __name__ == "__main__":
    main()
