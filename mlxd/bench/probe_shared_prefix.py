"""What a shared prefix's attention would save: one decode step's attention layers for B rows
whose first P keys are one shared prefix (an agent fleet's system prompt) and whose last S are
their own, as folded attention runs it now (every row's whole KV) and with the prefix's keys and
values held once: its scores for all rows' queries are one matmul over one copy, joined with the
rows' own scores before one precise softmax, and the weighted sum is split in two matmuls (which
rounds otherwise than folded attention: it would be opt-in). docs/performance.md §1.

    python -m mlxd.bench.probe_shared_prefix --shape qwen3-0.6b --rows 8 32 --prefix 3600 --own 512

Prints ms per step (all layers, median) for both and their largest difference in the output.
"""

import mlx.core as mx

from ..model.folded_attention import attention as folded_attention
from ..model.shared_attention import shared_prefix_attention
from .models import attention_dims, rows_parser
from .probe_attention import timed


def row(B: int, P: int, S: int, heads: int, kv: int, D: int, layers: int) -> str:
    bf = mx.bfloat16
    pk, pv = (mx.random.normal((1, kv, P, D)).astype(bf) for _ in range(2))
    k, v = (mx.random.normal((B, kv, S, D)).astype(bf) for _ in range(2))
    q = mx.random.normal((B, heads, 1, D)).astype(bf)
    pad = mx.array([(i * 37) % min(300, S) for i in range(B)])
    own_mask = mx.arange(S)[None] >= pad[:, None]  # rows' own tokens, left-padded
    # What the batch cache holds now: each row's copy of the prefix, then its own tokens.
    fk = mx.concatenate([mx.broadcast_to(pk, (B, kv, P, D)), k], axis=2)
    fv = mx.concatenate([mx.broadcast_to(pv, (B, kv, P, D)), v], axis=2)
    full_mask = mx.concatenate([mx.ones((B, P), mx.bool_), own_mask], axis=1)
    mx.eval(pk, pv, k, v, q, fk, fv, own_mask, full_mask)
    s = D**-0.5
    now = timed(lambda: [folded_attention(q, fk, fv, s, full_mask) for _ in range(layers)])
    shared = timed(
        lambda: [shared_prefix_attention(q, pk, pv, k, v, s, own_mask) for _ in range(layers)]
    )
    a = folded_attention(q, fk, fv, s, full_mask).astype(mx.float32)
    b = shared_prefix_attention(q, pk, pv, k, v, s, own_mask).astype(mx.float32)
    diff = mx.abs(a - b).max().item()
    return (
        f"B={B:2d} prefix {P} own {S} {layers} layers: folded {now:7.2f} ms | shared prefix "
        f"{shared:7.2f} ms ({now / shared:.2f}x) | max |diff| {diff:.3g}"
    )


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-host", [8, 32])
    p.add_argument("--prefix", type=int, default=3600)
    p.add_argument("--own", type=int, default=512)
    a = p.parse_args(argv)
    heads, kv, D, layers = attention_dims(a.shape)
    for B in a.rows:
        print(row(B, a.prefix, a.own, heads, kv, D, layers), flush=True)


if __name__ == "__main__":
    main()
