"""Few-row bf16 matmuls on CUDA: MLX's (gemv at one row, cuBLASLt above) against mlxd's
tensor-core kernel (mlxd/model/skinny_matmul.py), per layer shape and as whole decode steps
(docs/performance.md, §1).

    python -m mlxd.bench.probe_matmul --shape qwen3-8b --rows 1 2 4 8 16 32 --contexts 512 4096

Each timing multiplies one row block by a full model's worth of distinct weights (every layer's
projections), so no weight stays in L2; GB/s is the weights read per second.
"""

import argparse

import mlx.core as mx

from ..model.folded_attention import folded
from ..model.skinny_matmul import skinny_matmul, supported, wrap_linears
from .models import SHAPES, build_random
from .probe_attention import step_row, timed


def _linear_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads
    q, kv, f = heads * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    return [("q", q, h), ("k/v", kv, h), ("o", h, q), ("gate/up", f, h), ("down", h, f)]


def _kernel_ok(x: mx.array, w: mx.array) -> bool:
    try:
        mx.eval(skinny_matmul(x, w))
        return True
    except Exception as e:  # a device without the kernel still gets MLX's numbers
        print(f"skinny kernel unavailable: {e}", flush=True)
        return False


def matmul_rows(cfg: dict, rows: list[int]) -> None:
    layers = cfg["num_hidden_layers"]
    for name, N, K in _linear_shapes(cfg):
        ws = [mx.random.normal((N, K)).astype(mx.bfloat16) * 0.02 for _ in range(layers)]
        mx.eval(ws)
        gb = layers * N * K * 2 / 1e9
        for M in rows:
            x = mx.random.normal((M, K)).astype(mx.bfloat16)
            mx.eval(x)
            t_mlx = timed(lambda x=x, ws=ws: [x @ w.T for w in ws])
            line = f"{name:8s} N={N:6d} K={K:6d} M={M:2d}: MLX {t_mlx:6.3f} ms"
            line += f" ({gb / t_mlx * 1e3:6.0f} GB/s)"
            if supported(M, N, K, x.dtype) and _kernel_ok(x, ws[0]):
                t_sk = timed(lambda x=x, ws=ws: [skinny_matmul(x, w) for w in ws])
                ref = x.astype(mx.float32) @ ws[0].astype(mx.float32).T
                err_sk = mx.abs(skinny_matmul(x, ws[0]).astype(mx.float32) - ref).max().item()
                err_mlx = mx.abs((x @ ws[0].T).astype(mx.float32) - ref).max().item()
                same = mx.array_equal(skinny_matmul(x, ws[0]), x @ ws[0].T).item()
                line += (
                    f" | skinny {t_sk:6.3f} ms ({gb / t_sk * 1e3:6.0f} GB/s, x{t_mlx / t_sk:4.2f})"
                    f" | max err vs f32: skinny {err_sk:.2e}, MLX {err_mlx:.2e}, bit-equal {same}"
                )
            print(line, flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
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
    fold = folded(model)
    kv, D = cfg["num_key_value_heads"], cfg.get("head_dim") or 128
    print("=== whole decode steps: MLX | folded attention | folded + skinny matmuls", flush=True)
    rows = {}
    for variant, m in (("mlx", model), ("folded", fold)):
        rows[variant] = [step_row(m, B, L, kv, D) for B in args.rows for L in args.contexts]
    probe = mx.zeros((8, 256), mx.bfloat16)
    if _kernel_ok(probe, mx.zeros((32, 256), mx.bfloat16)):
        wrap_linears(fold.model)  # the layers' attention and MLP projections of the folded copy
        rows["skinny"] = [step_row(fold, B, L, kv, D) for B in args.rows for L in args.contexts]
    for i in range(len(rows["mlx"])):
        print(" || ".join(r[i] for r in rows.values()), flush=True)


if __name__ == "__main__":
    main()
