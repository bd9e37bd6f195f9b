"""B=1 host overhead: mlxd's per-token bookkeeping around the serial row's step, and its step
over 2-D rows (model/plain_rows.py), on a shape where the host dominates (qwen3-host cut to
`--layers`, or any `--shape`), against mlx-lm's stream_generate.

    python -m bench.probes.probe_overhead --layers 1 --rounds 15
    python -m bench.probes.probe_overhead --shape qwen3-0.6b --rounds 20 --prompt-tokens 512

Four sides alternate round by round (the order rotating): mlx-lm, mlxd, mlxd with its rows
step off (`mlxd/mlx-step`: mlx-lm's model call, `--decode-step mlx`), and mlxd with the lone
row's q/k/v and gate/up stacked (`mlxd/fused`, `--decode-step rows+fused`). Prints each side's
per-token time (after the first token; medians over rounds), the per-round speed ratios
(> 1 when the second side is faster) and, for mlxd, the per-token time spent outside
`SerialRow.decode` (turns, events, the reader's loop): the part of a host-bound step that is
mlxd's own. docs/performance.md §4 items 3 and 8.
"""

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate

from bench.probes.common import stream_parser
from mlxd.bench.models import SHAPES, build_random
from mlxd.engine import stream_generate as mlxd_stream_generate
from mlxd.engine.api import engine_for
from mlxd.engine.serial import SerialRow


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


def run(shape: str, rounds: int, prompt_tokens: int, gen: int) -> list[str]:
    bm = build_random(shape, "bfloat16")
    prompt = mx.array([1 + (i * 7919) % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    config = engine_for(bm.model).config  # the API's engine: its rows step set per side

    def mlxd_with(rows: bool, fused: bool = False) -> Callable:
        def fn(*args: Any, **kwargs: Any) -> Iterator[Any]:
            config.decode_rows, config.decode_fused = rows, fused  # read per serial row
            return mlxd_stream_generate(*args, **kwargs)

        return fn

    sides = {
        "mlx-lm": stream_generate,
        "mlxd": mlxd_with(True),
        "mlxd/mlx-step": mlxd_with(False),
        "mlxd/fused": mlxd_with(True, fused=True),
    }
    for fn in sides.values():  # warm-up
        _per_token(fn, bm, prompt, gen)
    times: dict[str, list[float]] = {k: [] for k in sides}
    outside: list[float] = []
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            per, out = _per_token(sides[name], bm, prompt, gen)
            times[name].append(per)
            if name == "mlxd":
                outside.append(out)
    config.decode_rows, config.decode_fused = True, False
    lines = [
        f"{name}: {statistics.median(v):.1f} us per token [{min(v):.1f}-{max(v):.1f}]"
        for name, v in times.items()
    ]
    pairs = [("mlx-lm", "mlxd"), ("mlx-lm", "mlxd/mlx-step"), ("mlxd/mlx-step", "mlxd")]
    for a, b in [*pairs, ("mlxd", "mlxd/fused")]:
        ratios = [x / y for x, y in zip(times[a], times[b], strict=True)]
        lines.append(
            f"per-round speed ratio {a}/{b} {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}-{max(ratios):.3f}]"
        )
    lines.append(f"mlxd outside SerialRow.decode: {statistics.median(outside):.1f} us per token")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = stream_parser(__doc__, rounds=15, prompt_tokens=32, gen_tokens=400)
    p.add_argument(
        "--layers", type=int, default=None, help="qwen3-host cut to this many layers (28 in full)"
    )
    a = p.parse_args(argv)
    shape = a.shape
    if a.layers is not None:
        shape = f"qwen3-host-{a.layers}"
        SHAPES[shape] = dict(SHAPES["qwen3-host"], num_hidden_layers=a.layers)
    print("\n".join(run(shape, a.rounds, a.prompt_tokens, a.gen_tokens)), flush=True)


if __name__ == "__main__":
    main()
