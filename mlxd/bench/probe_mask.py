"""A padded prefill's attention under mlx-lm's boolean mask against the additive one mlxd hands
MLX-CUDA (kv/additive_mask.py): bit equality, the wall time, and (with --kernels, device only)
the kernels each one runs. Also says whether mlxd's check takes the additive form here.

    python -m mlxd.bench.probe_mask --rows 32 --new 332 --cached 3900 [--kernels]
"""

import argparse
import time

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from ..kv.additive_mask import additive, fused_prefill


def _timed(fn, repeats: int = 5) -> tuple[mx.array, float]:
    out = fn()
    mx.eval(out)
    t = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn())
    return out, (time.perf_counter() - t) * 1e3 / repeats


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--new", type=int, default=332)
    p.add_argument("--cached", type=int, default=3900)
    p.add_argument("--heads", type=int, nargs=2, default=[16, 8], help="query and KV heads")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--kernels", action="store_true")
    args = p.parse_args(argv)
    B, L, S, (Hq, Hkv), D = args.rows, args.new, args.cached + args.new, args.heads, args.dim
    dt = mx.bfloat16
    key = mx.random.key(0)
    q = mx.random.normal((B, Hq, L, D), key=key).astype(dt)
    k = mx.random.normal((B, Hkv, S, D), key=mx.random.key(1)).astype(dt)
    v = mx.random.normal((B, Hkv, S, D), key=mx.random.key(2)).astype(dt)
    pad = mx.array([(i * 7) % 40 for i in range(B)])
    mask = create_causal_mask(L, offset=args.cached, left_padding=pad)
    print(f"device {mx.default_device()}, fused_prefill {fused_prefill(dt, D, D)}", flush=True)
    masks = {"boolean": mask, "additive": additive(mask, dt)}
    mx.eval(q, k, v, *masks.values())
    outs = {}
    for name, m in masks.items():

        def run(m=m):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=m)

        outs[name], ms = _timed(run)
        print(f"{name:9} mask: {ms:8.3f} ms a call", flush=True)
        if args.kernels:
            import torch.profiler as tp

            from .probe_kernels import exported, summarize

            with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
                mx.eval(run())
            print("\n".join(summarize(exported(prof), 1, 6)), flush=True)
    same = mx.array_equal(outs["boolean"], outs["additive"], equal_nan=True).item()
    print(f"bit-equal: {same}", flush=True)


if __name__ == "__main__":
    main()
