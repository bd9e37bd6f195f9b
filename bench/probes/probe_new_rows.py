"""What a batched step costs the first time a process meets its row count, against the same
step once warm, and the same for rows leaving by slices (kv/take_rows.py) to that count.

In an H200 fleet the first step after 5 of 32 rows left took 2.8 s, and a first
3-row prefill 0.9 s, where a warm step takes ~10 ms (docs/performance.md §1). MLX-CUDA's
compiled kernels take the shape as an argument, so the suspects are per-shape first calls:
cuBLASLt's heuristic and kernel load at a new M, JIT-compiled gathers or copies, cuDNN. Each
row count here is met twice in one process (`--passes`), so a first cost shows as pass 1's
first step against pass 2's (pass 1's first row count also carries the process's first step).
Device memory is a suspect too: a new row count's arrays have sizes MLX's buffer cache holds
none of, so each line also times building that count's caches and every layer's leave from the
top count (fresh allocations in pass 1, the cache's freed buffers again in pass 2).
A leave also gathers what mlx-lm's filter keeps (the next tokens, uint32; the caches' offsets
and left padding, int32), and MLX-CUDA JIT-compiles one gather module per dtype at its first
use, which a fleet whose rows all end together may never have made. So the process first times
one small gather per dtype, twice, before anything else runs (`first gathers`).

    python -m bench.probes.probe_new_rows --shape qwen3-0.6b --rows 32 27 5 3 --context 3700 4027
"""

import statistics
import time
from functools import partial
from typing import Any

import mlx.core as mx

from bench.probes.common import attention_dims, rows_parser
from bench.probes.probe_graphs import _caches
from bench.probes.probe_ops import model_for, step_fn
from mlxd.bench.models import build_random
from mlxd.kv.take_rows import take_rows
from mlxd.model.folded_attention import MODES


def _ms(fn: Any) -> float:
    """Wall ms of `fn()` evaluated, from a synced start."""
    mx.synchronize()
    t0 = time.perf_counter()
    mx.eval(fn())
    return 1e3 * (time.perf_counter() - t0)


GATHER_DTYPES = (mx.uint32, mx.int32, mx.float32, mx.bfloat16)


def first_gathers() -> str:
    """Ms for a small gather of each dtype, its first use in the process and again."""
    out, keep = [], mx.array([1, 3, 4])
    for dtype in GATHER_DTYPES:
        x = mx.arange(8).astype(dtype)
        mx.eval(x, keep)
        first, again = (_ms(partial(x.__getitem__, keep)) for _ in range(2))
        out.append(f"{str(dtype).split('.')[-1]} {first:.1f} / {again:.1f} ms")
    return "first gathers, first / again: " + ", ".join(out)


def _keep(rows: int, cache_rows: int) -> list[int]:
    """`rows` of `cache_rows` in two runs, as when rows in the middle end."""
    return [*range(rows // 2), *range(cache_rows - (rows - rows // 2), cache_rows)]


def leave_to(rows: int, cache_rows: int, context: int, kv: int, D: int) -> tuple[float, bool]:
    """Ms to keep `rows` of a `cache_rows`-row layer cache by slices, and whether they equal
    mlx-lm's gather of the same rows."""
    x = mx.random.normal((cache_rows, kv, context, D)).astype(mx.bfloat16)
    mx.eval(x)
    keep = _keep(rows, cache_rows)
    ms = _ms(lambda: (take_rows(x, keep, by_slices=True),))
    return ms, mx.array_equal(take_rows(x, keep, by_slices=True), x[mx.array(keep)]).item()


def whole_leave(caches: list[Any], rows: int) -> float:
    """Ms for every layer's keys and values to keep `rows` by slices, as a leave step's filter
    does; the outputs are dropped at return, so their buffers go back to MLX's cache."""
    keep = _keep(rows, caches[0].keys.shape[0])
    return _ms(
        lambda: [take_rows(a, keep, by_slices=True) for c in caches for a in (c.keys, c.values)]
    )


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [32, 27, 28, 29, 5, 3])
    p.add_argument("--context", type=int, nargs="+", default=[3700], help="cached keys a row")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--mode", choices=MODES, default="folded+fused")
    args = p.parse_args(argv)
    print(first_gathers(), flush=True)  # before the model: its embedding lookup is a gather
    bm = build_random(args.shape, "bfloat16")
    model = model_for(bm.model, args.mode)
    _, kv, D, _ = attention_dims(args.shape)
    top, base = max(args.rows), args.context[0]
    held = _caches(model, top, base, kv, D, args.steps + 2)  # every leave's source
    print(f"{args.shape}, {args.mode}, {mx.default_device()}; leaves at {base} keys")
    for n in range(1, args.passes + 1):
        for keys in args.context:  # a new cache length is a new shape too
            for rows in args.rows:
                print(f"pass {n} rows {rows:3d} keys {keys:5d}: " + _line(model, rows, keys, args,
                      held if keys == base and rows < top else None), flush=True)  # fmt: skip


def _line(model: Any, rows: int, keys: int, args: Any, held: list[Any] | None) -> str:
    """One row count at one cache length: its caches' build, first and warm steps, leaves."""
    _, kv, D, _ = attention_dims(args.shape)
    t0 = time.perf_counter()
    step = step_fn(model, rows, keys, kv, D, args.steps + 2)
    built = 1e3 * (time.perf_counter() - t0)  # step_fn evaluates its caches
    first = _ms(step)
    warm = statistics.median(_ms(step) for _ in range(args.steps))
    line = f"caches {built:8.1f} ms, first step {first:8.1f} ms, warm {warm:6.2f} ms"
    if held is not None:
        top = held[0].keys.shape[0]
        ms, equal = leave_to(rows, top, keys, kv, D)
        line += f"; a layer's leave from {top}: {ms:7.2f} ms, equal {equal}"
        line += f"; every layer's: {whole_leave(held, rows):8.1f} ms"
    return line  # the step and its caches go here, their buffers back to MLX's cache


if __name__ == "__main__":
    main()
