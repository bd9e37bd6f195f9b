"""Few-row bf16 matmuls on CUDA (MLX's gemv at one row, cuBLASLt above, and MLX's own CUTLASS
kernel behind `mx.gather_mm`), per layer shape, then whole decode steps with MLX's attention and
with folded attention (docs/performance.md, §1).

    python -m bench.probes.probe_matmul --shape qwen3-8b --rows 1 2 8 32 --contexts 512 4096

Each timing multiplies one row block by a full model's worth of distinct weights (every layer's
projections), so no weight stays in L2; GB/s is the weights read per second; host is the time
to build and encode the calls (until `mx.async_eval` returns). The calls are independent, so
with CUDA graphs on MLX's graph may run them side by side: a step, where each projection waits
for the one before, sees a kernel's whole latency (gather_mm looked faster here and made whole steps
slower). A tensor-core kernel for 2-32 rows was tried against these numbers
and not kept (commit 3d3e677), nor was gather_mm (commit 15ffa20).
"""

import statistics
import time
from collections.abc import Callable

import mlx.core as mx

from bench.probes.common import rows_parser
from bench.probes.probe_attention import step_row
from mlxd.bench.models import SHAPES, build_random
from mlxd.model.folded_attention import folded


def _linear_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads
    q, kv, f = heads * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    return [("q", q, h), ("k/v", kv, h), ("o", h, q), ("gate/up", f, h), ("down", h, f)]


def _fused_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    """The folded+fused step's stacked projections and its output head."""
    (_, q, h), (_, kv, _), _, (_, f, _), _ = _linear_shapes(cfg)
    return [("qkv", q + 2 * kv, h), ("gate_up", 2 * f, h), ("head", cfg["vocab_size"], h)]


def matmul_rows(cfg: dict, rows: list[int]) -> None:
    index = mx.zeros((1,), mx.uint32)  # gather_mm's one weight, built once: no call times it
    mx.eval(index)
    for name, N, K in _linear_shapes(cfg) + _fused_shapes(cfg):
        layers = 4 if name == "head" else cfg["num_hidden_layers"]  # the head: 4 copies
        ws = [mx.random.normal((N, K)).astype(mx.bfloat16) * 0.02 for _ in range(layers)]
        mx.eval(ws)
        gb = layers * N * K * 2 / 1e9
        views = [mx.expand_dims(w, 0).swapaxes(1, 2) for w in ws]  # gather_mm's (1, K, N), no copy
        for M in rows:
            x = mx.random.normal((M, 1, K)).astype(mx.bfloat16)
            mx.eval(x)
            host, t = host_timed(lambda x=x, ws=ws: [x @ w.T for w in ws])
            line = (
                f"{name:8s} N={N:6d} K={K:6d} M={M:2d}: {t:6.3f} ms ({gb / t * 1e3:6.0f} GB/s, "
                f"host {host:6.3f})"
            )
            if M > 1 and mx.cuda.is_available():  # gather_mm (bf16 on CUDA only) vs cuBLAS
                mx.eval(views)
                host, t = host_timed(lambda x=x, vs=views: [gathered(x, v, index) for v in vs])
                diff = mx.abs(gathered(x, views[0], index) - x @ ws[0].T).max().item()
                line += f" | gather_mm {t:6.3f} ms (host {host:6.3f}, max diff {diff:.2e})"
            print(line, flush=True)


def gathered(x: mx.array, view: mx.array, index: mx.array) -> mx.array:
    """x (M, 1, K) @ the weight behind `view`, through gather_mm's kernel instead of cuBLASLt
    (`index`: a uint32 zero, the one weight for the one batch)."""
    M, _, K = x.shape
    return mx.gather_mm(x.reshape(1, M, K), view, index, index).reshape(M, 1, -1)


def host_timed(fn: Callable[[], object], n: int = 6) -> tuple[float, float]:
    """Median ms to build and encode fn's graph (until async_eval returns), and to finish it."""
    hosts, totals = [], []
    for _ in range(n + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn()
        mx.async_eval(out)
        t1 = time.perf_counter()
        mx.eval(out)
        mx.synchronize()
        hosts.append(t1 - t0)
        totals.append(time.perf_counter() - t0)
    return 1000 * statistics.median(hosts[2:]), 1000 * statistics.median(totals[2:])


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-8b", [1, 2, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--no-steps", action="store_true", help="matmuls only, no model")
    p.add_argument("--no-matmuls", action="store_true", help="whole steps only")
    args = p.parse_args(argv)
    cfg = SHAPES[args.shape]
    if not args.no_matmuls:
        matmul_rows(cfg, args.rows)
    if args.no_steps:
        return
    model = build_random(args.shape, "bfloat16", 0).model
    kv, D = cfg["num_key_value_heads"], cfg.get("head_dim") or 128
    print("=== whole decode steps: MLX's attention || folded attention", flush=True)
    for B in args.rows:
        for L in args.contexts:
            row = [step_row(m, B, L, kv, D) for m in (model, folded(model))]
            print(" || ".join(row), flush=True)


if __name__ == "__main__":
    main()
