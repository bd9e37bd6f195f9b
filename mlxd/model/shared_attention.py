"""Decode attention over a shared prefix held once (`--batched-attention folded+shared`).

Folded attention's formula (scale, scores, mask, precise softmax, weighted sum) for rows whose
first P keys are one shared copy (kv/shared_prefix.py): every row's query group scores the
prefix in one matmul over that copy, the rows' own keys in the usual batched matmul, and both
score sets go through one softmax, so the weights are the formula's. The sums differ in order
from folded attention over the whole row (the prefix's weighted sum is its own matmul): the bits
may differ, as folded attention's do on CUDA, so the mode is opt-in.
"""

import mlx.core as mx


def shared_prefix_attention(
    q: mx.array, pk: mx.array, pv: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array
) -> mx.array:
    """q (B, heads, 1, D); pk / pv (1, kv_heads, P, D), the shared prefix; k / v (B, kv_heads,
    S, D), each row's own keys; mask (B, S) or (B, 1, 1, S), boolean (True: attend) or additive
    over those. Returns (B, heads, 1, D)."""
    B, n_heads, _, D = q.shape
    n_kv, P = pk.shape[1], pk.shape[2]
    g = n_heads // n_kv
    q = (q * mx.array(scale, q.dtype)).reshape(B, n_kv, g, D)
    # Every row's query group against the one prefix copy: (kv, B*g, D) @ (kv, D, P).
    qs = q.transpose(1, 0, 2, 3).reshape(n_kv, B * g, D)
    shared = (qs @ pk[0].swapaxes(-1, -2)).reshape(n_kv, B, g, P).transpose(1, 0, 2, 3)
    own = q @ k.swapaxes(-1, -2)  # (B, kv, g, S)
    mask = mask.reshape(B, 1, 1, -1)
    if mask.dtype == mx.bool_:
        own = mx.where(mask, own, mx.array(mx.finfo(own.dtype).min, own.dtype))
    else:
        own = own + mask
    probs = mx.softmax(mx.concatenate([shared, own], axis=-1), axis=-1, precise=True)
    ps = probs[..., :P].transpose(1, 0, 2, 3).reshape(n_kv, B * g, P)
    out = (ps @ pv[0]).reshape(n_kv, B, g, D).transpose(1, 0, 2, 3) + probs[..., P:] @ v
    return out.reshape(B, n_heads, 1, D)
