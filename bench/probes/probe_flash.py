"""Flash-decoding attention (mlxd/model/decode_kernel.py, CUDA only) against folded attention,
the mode it would replace: each one's largest error against the float32 formula, and the time
of a step's worth of attention layers (the cache's key/value views, left padding varied).

    python -m bench.probes.probe_flash --shape qwen3-0.6b --rows 8 32 --contexts 512 4096
"""

import mlx.core as mx

from bench.probes.common import attention_dims, rows_parser
from bench.probes.probe_attention import decode_inputs, timed
from mlxd.model.aligned_keys import AlignedMasks, aligned, key_alignment
from mlxd.model.decode_kernel import Tiling, available, flash_attention
from mlxd.model.folded_attention import attention


class _Buffer:
    """What `aligned` reads of a cache: its key and value buffers."""

    def __init__(self, keys: mx.array, values: mx.array) -> None:
        self.keys, self.values = keys, values


def row(B: int, L: int, heads: int, kv: int, D: int, layers: int, tilings: list[Tiling]) -> str:
    kb, vb, q, k, v, mask = decode_inputs(B, L, heads, kv, D)
    s = D**-0.5
    masks, buf = AlignedMasks(), _Buffer(kb, vb)

    def folded() -> mx.array:  # as FoldedAttention runs it: keys aligned, then o_proj's layout
        ka, va, ma = aligned(key_alignment(), buf, k, v, mask, masks)
        return attention(q, ka, va, s, ma).transpose(0, 2, 1, 3).reshape(B, 1, -1)

    f32 = [x.astype(mx.float32) for x in (q, k, v)]
    ref = attention(*f32, s, mask).transpose(0, 2, 1, 3).reshape(B, 1, -1)
    err_folded = mx.abs(folded().astype(mx.float32) - ref).max().item()
    t_folded = timed(lambda: [folded() for _ in range(layers)])
    cells = []
    for t in tilings:
        out = flash_attention(q, k, v, s, mask, t)
        err = mx.abs(out.astype(mx.float32) - ref).max().item()
        ms = timed(lambda t=t: [flash_attention(q, k, v, s, mask, t) for _ in range(layers)])
        name = f"{t.keys},{t.warps},{t.blocks}"
        cells.append(f"{name}: {ms:6.2f} ms ({t_folded / ms:4.2f}x, {err:.1e})")
    return (
        f"B={B:2d} L={L:5d} {layers} layers: folded {t_folded:6.2f} ms (error {err_folded:.1e}) | "
        "flash keys,warps,blocks: " + " | ".join(cells)
    )


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--tilings", nargs="+", default=["2,4,1056"], help="keys,warps,blocks each")
    args = p.parse_args(argv)
    if (why := available()) is not None:
        raise SystemExit(why)
    heads, kv, D, layers = attention_dims(args.shape)
    tilings = [Tiling(*map(int, t.split(","))) for t in args.tilings]
    for B in args.rows:
        for L in args.contexts:
            print(row(B, L, heads, kv, D, layers, tilings), flush=True)


if __name__ == "__main__":
    main()
