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
from .models import attention_dims, rows_parser
from .probe_attention import timed


def shared_prefix_attention(
    q: mx.array, pk: mx.array, pv: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array
) -> mx.array:
    """q (B, heads, 1, D); pk/pv (kv_heads, P, D), the shared prefix; k/v (B, kv_heads, S, D),
    each row's own tokens; mask (B, S) boolean over them (True: attend)."""
    B, n_heads, _, D = q.shape
    n_kv, P = pk.shape[0], pk.shape[1]
    g = n_heads // n_kv
    q = (q * mx.array(scale, q.dtype)).reshape(B, n_kv, g, D)
    # Every row's query group against the one prefix copy: (kv, B*g, D) @ (kv, D, P).
    qs = q.transpose(1, 0, 2, 3).reshape(n_kv, B * g, D)
    shared = (qs @ pk.swapaxes(-1, -2)).reshape(n_kv, B, g, P).transpose(1, 0, 2, 3)
    own = q @ k.swapaxes(-1, -2)  # (B, kv, g, S)
    own = mx.where(mask[:, None, None, :], own, mx.array(mx.finfo(own.dtype).min, own.dtype))
    probs = mx.softmax(mx.concatenate([shared, own], axis=-1), axis=-1, precise=True)
    ps = probs[..., :P].transpose(1, 0, 2, 3).reshape(n_kv, B * g, P)
    out = (ps @ pv).reshape(n_kv, B, g, D).transpose(1, 0, 2, 3) + probs[..., P:] @ v
    return out.reshape(B, n_heads, 1, D)


def row(B: int, P: int, S: int, heads: int, kv: int, D: int, layers: int) -> str:
    bf = mx.bfloat16
    pk, pv = (mx.random.normal((kv, P, D)).astype(bf) for _ in range(2))
    k, v = (mx.random.normal((B, kv, S, D)).astype(bf) for _ in range(2))
    q = mx.random.normal((B, heads, 1, D)).astype(bf)
    pad = mx.array([(i * 37) % min(300, S) for i in range(B)])
    own_mask = mx.arange(S)[None] >= pad[:, None]  # rows' own tokens, left-padded
    # What the batch cache holds now: each row's copy of the prefix, then its own tokens.
    fk = mx.concatenate([mx.broadcast_to(pk[None], (B, kv, P, D)), k], axis=2)
    fv = mx.concatenate([mx.broadcast_to(pv[None], (B, kv, P, D)), v], axis=2)
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
