"""Where a batched decode step's time goes: MLX's masked attention against the fused kernel
without a mask and against folded attention (mlxd/model/folded_attention.py), then whole steps of
a random model with BatchKVCache filled to a context (docs/performance.md, §1).

    python -m bench.probes.probe_attention --shape qwen3-8b --rows 1 8 32 --contexts 512 4096
"""

import statistics
import time
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from bench.probes.common import attention_dims, rows_parser
from mlxd.bench.models import build_random
from mlxd.model.folded_attention import attention as folded_attention


def timed(fn: Callable[[], object], n: int = 6) -> float:
    """Median ms of n synchronized runs after 2 untimed ones."""
    ts = []
    for _ in range(n + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts[2:])


def decode_inputs(B: int, L: int, heads: int, kv: int, D: int) -> tuple[mx.array, ...]:
    """A decode step's attention inputs: key/value buffers of 256-token steps, q, the buffers'
    views of L keys (as mlx-lm's cache hands them) and a mask with left padding varied."""
    cap = (L // 256 + 1) * 256
    kb, vb = (mx.random.normal((B, kv, cap, D)).astype(mx.bfloat16) for _ in range(2))
    q = mx.random.normal((B, heads, 1, D)).astype(mx.bfloat16)
    pad = mx.array([(i * 37) % min(300, L) for i in range(B)])
    mask = (mx.arange(L)[None] >= pad[:, None]).reshape(B, 1, 1, L)
    mx.eval(kb, vb, q, mask)
    return kb, vb, q, kb[..., :L, :], vb[..., :L, :], mask


def attention_row(B: int, L: int, heads: int, kv: int, D: int, layers: int) -> str:
    _, _, q, k, v, mask = decode_inputs(B, L, heads, kv, D)
    s = D**-0.5
    sdpa = mx.fast.scaled_dot_product_attention
    masked = timed(lambda: [sdpa(q, k, v, scale=s, mask=mask) for _ in range(layers)])
    fused = timed(lambda: [sdpa(q, k, v, scale=s) for _ in range(layers)])
    folded = timed(lambda: [folded_attention(q, k, v, s, mask) for _ in range(layers)])
    same = mx.array_equal(sdpa(q, k, v, scale=s, mask=mask), folded_attention(q, k, v, s, mask))
    return (
        f"B={B:2d} L={L:5d} {layers} layers: masked (MLX) {masked:7.2f} ms | no mask {fused:7.2f}"
        f" | folded {folded:7.2f} (bit-equal to masked: {same.item()})"
    )


def step_row(model, B: int, L: int, kv: int, D: int) -> str:
    """One decode step over BatchKVCache layers holding L random tokens (left padding varied)."""
    caches = []
    for _ in model.layers:
        c = BatchKVCache([(i * 37) % min(300, L) for i in range(B)])
        n = (L // 256 + 1) * 256
        c.keys, c.values = (mx.random.normal((B, kv, n, D)).astype(mx.bfloat16) for _ in range(2))
        c._idx, c.offset = L, c.offset + L
        caches.append(c)
    mx.eval([c.keys for c in caches], [c.values for c in caches])
    tokens = mx.zeros((B, 1), mx.int32)

    def step():
        out = model(tokens, cache=caches)
        for c in caches:  # stay at L
            c._idx, c.offset = c._idx - 1, c.offset - 1
        return out

    t = timed(step, 8)
    return f"B={B:2d} L={L:5d} whole step {t:7.2f} ms ({B / t * 1000:7.1f} tok/s)"


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-8b", [1, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--no-steps", action="store_true", help="attention only, no model")
    args = p.parse_args(argv)
    heads, kv, D, layers = attention_dims(args.shape)
    for B in args.rows:
        for L in args.contexts:
            print(attention_row(B, L, heads, kv, D, layers), flush=True)
    if args.no_steps:
        return
    model = build_random(args.shape, "bfloat16", 0).model
    for B in args.rows:
        for L in args.contexts:
            print(step_row(model, B, L, kv, D), flush=True)
            mx.clear_cache()


if __name__ == "__main__":
    main()
