"""A batch's rows leaving (mlx-lm's `filter`: `keys[keep]`, a gather) against the same rows taken
as slices of keep's runs (`kv/take_rows.py`, the batch caches' filter on CUDA since session 30),
on every layer of a batch cache at a fleet's size. docs/performance.md.

    python -m mlxd.bench.probe_filter --shape qwen3-0.6b --rows 32 --tokens 3700

Per repeat and selection (all rows but one; the first 4, the last 28: a partial split), the
time until every layer's keys and values are taken and written once at their last position,
as the next step's cache update does (a view of one run is copied there), and whether the two
agree.
"""

import argparse
import time

import mlx.core as mx

from ..kv.take_rows import take_rows
from .models import attention_dims


def _time(fn, arrays: list[mx.array]) -> tuple[float, list[mx.array]]:
    mx.synchronize()
    tic = time.perf_counter()
    out = []
    for a in arrays:
        x = fn(a)
        x[..., -1:, :] = mx.zeros((x.shape[0], x.shape[1], 1, x.shape[3]), x.dtype)
        out.append(x)
    mx.eval(out)
    mx.synchronize()
    return 1000 * (time.perf_counter() - tic), out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--tokens", type=int, default=3700)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    _, kv_heads, head_dim, layers = attention_dims(a.shape)
    shape = (a.rows, kv_heads, a.tokens, head_dim)
    arrays = [mx.random.normal(shape, key=mx.random.key(i)).astype(mx.bfloat16)
              for i in range(2 * layers)]  # fmt: skip
    mx.eval(arrays)
    picks = {
        "all but one": [i for i in range(a.rows) if i != a.rows // 2],
        "first 4": list(range(min(4, a.rows))),
        "last 28": list(range(max(0, a.rows - 28), a.rows)),
    }
    for rep in range(a.repeats):
        for name, keep in picks.items():
            idx = mx.array(keep, dtype=mx.int32)
            gather_ms, want = _time(lambda x, i=idx: x[i], arrays)
            slices_ms, got = _time(lambda x, k=keep: take_rows(x, k, by_slices=True), arrays)
            same = all(mx.array_equal(g, w).item() for g, w in zip(got, want, strict=True))
            print(f"repeat {rep} {name}: gather {gather_ms:.1f} ms | slices {slices_ms:.1f} ms"
                  f" | equal {same}", flush=True)  # fmt: skip
            del want, got


if __name__ == "__main__":
    main()
