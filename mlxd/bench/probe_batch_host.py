"""The batched step's host cost: mlx-lm's `batch_generate` against mlxd's, alternated round by
round on a host-bound shape (qwen3-host: Qwen3-0.6B's 28 layers at toy widths, so a step is
mostly the host building, dispatching and reading it back). No EOS: every row runs to the end.

    python -m mlxd.bench.probe_batch_host --rows 8 32 --rounds 4 --gen-tokens 300

Prints each side's milliseconds a step (the whole call over the tokens asked for, its short
prefill included) and mlxd's over mlx-lm's per round; > 1 is slower. docs/performance.md §2.
"""

import statistics
import time
from collections.abc import Callable

from mlx_lm.generate import batch_generate as mlx_lm_batch_generate

from ..engine import batch_generate
from .models import build_random, rows_parser


class _NoStops:
    """A tokenizer with no EOS (the rows never stop early) and no text to decode."""

    eos_token_ids: set[int] = set()

    def decode(self, tokens: list[int]) -> str:
        return ""


def run(shape: str, rows: int, rounds: int, gen_tokens: int) -> dict[str, list[float]]:
    """Per side, each round's milliseconds a step (round 0, a warm-up, left out)."""
    model = build_random(shape, "float32").model
    prompts = [[(r * 7 + j) % 1000 + 1 for j in range(32)] for r in range(rows)]
    tok = _NoStops()
    sides: dict[str, Callable[[], object]] = {
        "mlx-lm": lambda: mlx_lm_batch_generate(model, tok, prompts, max_tokens=gen_tokens),
        "mlxd": lambda: batch_generate(model, tok, prompts, max_tokens=gen_tokens),
    }
    out: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds + 1):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            tic = time.perf_counter()
            sides[name]()
            if r > 0:
                out[name].append(1e3 * (time.perf_counter() - tic) / gen_tokens)
    return out


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-host", [8, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--gen-tokens", type=int, default=300)
    args = p.parse_args(argv)
    for rows in args.rows:
        ms = run(args.shape, rows, args.rounds, args.gen_tokens)
        ratios = [b / a for a, b in zip(ms["mlx-lm"], ms["mlxd"], strict=True)]
        a, b = statistics.median(ms["mlx-lm"]), statistics.median(ms["mlxd"])
        print(
            f"{args.shape}, {rows} rows: mlx-lm {a:.2f} ms a step, mlxd {b:.2f} ms; mlxd/mlx-lm "
            f"per round {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
