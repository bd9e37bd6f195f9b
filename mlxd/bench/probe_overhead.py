"""B=1 host overhead: mlxd's per-token bookkeeping around the serial row's step, on a shape
where the host dominates (qwen3-host cut to `--layers`), against mlx-lm's stream_generate.

    python -m mlxd.bench.probe_overhead --layers 1 --rounds 15

Prints each side's per-token time (after the first token; medians over alternated rounds), the
per-round speed ratio (mlx-lm's time over mlxd's, > 1 when mlxd is faster) and, for mlxd, the
per-token time spent outside `SerialRow.decode` (turns, events, the reader's loop): the part of
a host-bound step that is mlxd's own. docs/performance.md §4 item 8.
"""

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate

from ..engine import stream_generate as mlxd_stream_generate
from ..engine.serial import SerialRow
from .models import SHAPES, build_random, stream_parser


@contextmanager
def _decode_timer() -> Iterator[list[float]]:
    """Seconds spent inside SerialRow.decode while the block runs (summed into one cell)."""
    spent, real = [0.0], SerialRow.decode

    def timed(self: SerialRow) -> Any:
        tic = time.perf_counter()
        try:
            return real(self)
        finally:
            spent[0] += time.perf_counter() - tic

    SerialRow.decode = timed  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        SerialRow.decode = real  # type: ignore[method-assign]


def _per_token(fn: Callable, bm: Any, prompt: mx.array, n: int) -> tuple[float, float]:
    """(µs per token after the first, µs per token outside SerialRow.decode)."""
    with _decode_timer() as inside:
        run = fn(bm.model, bm.tokenizer, prompt, max_tokens=n)
        next(run)
        inside[0], tic = 0.0, time.perf_counter()
        count = sum(1 for _ in run)
        total = time.perf_counter() - tic
    return 1e6 * total / count, 1e6 * (total - inside[0]) / count


def run(layers: int, rounds: int, prompt_tokens: int, gen: int) -> list[str]:
    shape = f"qwen3-host-{layers}"
    SHAPES[shape] = dict(SHAPES["qwen3-host"], num_hidden_layers=layers)
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    sides = {"mlx-lm": stream_generate, "mlxd": mlxd_stream_generate}
    for fn in sides.values():  # warm-up
        _per_token(fn, bm, prompt, gen)
    times: dict[str, list[float]] = {k: [] for k in sides}
    outside: list[float] = []
    for r in range(rounds):
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
            per, out = _per_token(sides[name], bm, prompt, gen)
            times[name].append(per)
            if name == "mlxd":
                outside.append(out)
    ratio = statistics.median(a / b for a, b in zip(times["mlx-lm"], times["mlxd"], strict=True))
    lines = [
        f"{name}: {statistics.median(v):.1f} us per token [{min(v):.1f}-{max(v):.1f}]"
        for name, v in times.items()
    ]
    lines.append(f"per-round speed ratio mlx-lm/mlxd {ratio:.3f}")
    lines.append(f"mlxd outside SerialRow.decode: {statistics.median(outside):.1f} us per token")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = stream_parser(__doc__, rounds=15, prompt_tokens=32, gen_tokens=400)
    p.add_argument("--layers", type=int, default=1, help="qwen3-host's layers (28 in full)")
    a = p.parse_args(argv)
    print("\n".join(run(a.layers, a.rounds, a.prompt_tokens, a.gen_tokens)), flush=True)


if __name__ == "__main__":
    main()
