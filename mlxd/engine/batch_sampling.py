"""Rows with different samplers sampled in a few batched calls, each row with its own draw.

When a batch's rows hold different sampler objects (every request with a temperature has its
own), mlx-lm's GenerationBatch samples row by row: a slice, the filter chain and a
`categorical` per row, then a concatenate, some 30 ops a row. On a one-row input MLX's
`categorical` is an inverse-CDF draw: one uniform from the thread's key sequence, scaled by
the row's weight sum, searched in the row's cumulative weights. Here rows with equal
parameters run mlx-lm's filter chain (XTC's with a coin per row) and that draw together. Each
row's keys are split on the host in row order, as mlx-lm's loop advances the key sequence, and
all uniforms come from one vmapped op; only each row's weight sum stays a per-row op, the same
1-D reduction as MLX's.
On the CPU this gives mlx-lm's tokens and keys bit for bit (tests/engine/test_batch_sampling.py);
elsewhere it is opt-in until those tests have run there (`--batched-sampling`).
"""

from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler

from . import threefry
from .rng import current_key, set_key
from .sampling import KeyedSampler, ParamSampler, SamplingParams


def default_on() -> bool:
    """Where the batched draw is proven equal to mlx-lm's per-row one: MLX's CPU backend, and
    MLX-CUDA (the tests passed on an H200, session 12). Metal waits for its run."""
    return not mx.metal.is_available()


def _params(sampler: Any) -> SamplingParams | None | bool:
    """The parameters behind a row's sampler; None for greedy; False if not ours to batch."""
    inner = sampler.inner if isinstance(sampler, KeyedSampler) else sampler
    if inner is greedy_sampler:
        return None
    if isinstance(inner, ParamSampler):
        return inner.params
    return False  # a user's sampler


def sample_rows(samplers: list[Any], logprobs: mx.array) -> mx.array | None:
    """Every row's next token as mlx-lm's per-row loop draws it, or None when a row's sampler
    is one this cannot batch (a user's callable): the caller then runs mlx-lm's loop."""
    found = [_params(s) for s in samplers]
    if any(p is False for p in found):
        return None
    params: list[SamplingParams | None] = found  # type: ignore[assignment]
    # The keys mlx-lm's loop would draw with, in row order, split on the host (threefry.py):
    # a seeded row's KeyedSampler first installs its own key, and the thread keeps the last.
    # XTC's coin is drawn first (its filter comes before categorical in make_sampler's chain).
    state, keys, coin_keys, drawn = current_key(), [], [], []
    for e, (s, p) in enumerate(zip(samplers, params, strict=True)):
        keyed = isinstance(s, KeyedSampler)
        if keyed:
            state = s.key
        if p is not None:
            if p.xtc_probability > 0.0:
                state, coin = threefry.split(state)
                coin_keys.append(coin)
            state, k = threefry.split(state)
            keys.append(k)
            drawn.append(e)
        if keyed:
            s.key = state
    set_key(state)
    u = _uniforms(keys)
    coins = _coins(coin_keys)
    at = {e: i for i, e in enumerate(drawn)}  # a row's place in `u`
    xtc_rows = [e for e in drawn if params[e].xtc_probability > 0.0]  # type: ignore[union-attr]
    at_coin = {e: i for i, e in enumerate(xtc_rows)}
    groups: dict[tuple, list[int]] = {}
    for e, p in enumerate(params):
        groups.setdefault(_signature(p), []).append(e)
    order: list[int] = []
    parts: list[mx.array] = []
    for rows in groups.values():
        x = logprobs[mx.array(rows)] if len(rows) < logprobs.shape[0] else logprobs
        p = params[rows[0]]
        if p is None:
            parts.append(greedy_sampler(x))
        else:
            ux = _take(u, [at[e] for e in rows])
            cx = _take(coins, [at_coin[e] for e in rows]) if p.xtc_probability > 0 else None
            parts.append(_draw(_filtered(x, p, cx), p.temp, ux))
        order += rows
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    if order == sorted(order):
        return out
    return out[mx.argsort(mx.array(order))]


def _signature(p: SamplingParams | None) -> tuple | None:
    """Rows whose samplers make_sampler would build alike share one filter chain and draw."""
    if p is None:
        return None
    xtc = (p.xtc_probability, p.xtc_threshold, tuple(p.xtc_special_tokens or ()))
    return (p.temp, p.top_p, p.min_p, p.min_tokens_to_keep, p.top_k, *xtc)


def _take(a: mx.array, rows: list[int]) -> mx.array:
    return a if rows == list(range(a.shape[0])) else a[mx.array(rows)]


def _uniforms(keys: list[tuple[int, int]]) -> mx.array:
    """One uniform per key, as `categorical` draws it on a one-row input: shape (n, 1)."""
    if not keys:
        return mx.zeros((0, 1))
    one = mx.vmap(lambda k: mx.random.uniform(shape=(1,), key=k))
    return one(mx.array(keys, dtype=mx.uint32))


def _coins(keys: list[tuple[int, int]]) -> mx.array:
    """XTC's coin per key, as apply_xtc draws it (`uniform(0, 1)`): shape (n, 1)."""
    if not keys:
        return mx.zeros((0, 1))
    one = mx.vmap(lambda k: mx.random.uniform(0, 1, key=k))
    return one(mx.array(keys, dtype=mx.uint32))[:, None]


def _filtered(x: mx.array, p: SamplingParams, coins: mx.array | None = None) -> mx.array:
    """make_sampler's filter chain, in its order, over the group's rows."""
    if 0 < p.top_p < 1.0:
        x = apply_top_p(x, p.top_p)
    if p.min_p != 0.0:
        x = apply_min_p(x, p.min_p, p.min_tokens_to_keep)
    if coins is not None:
        x = _xtc(x, coins, p.xtc_probability, p.xtc_threshold, p.xtc_special_tokens)
    if p.top_k > 0:
        x = apply_top_k(x, p.top_k)
    return x


def _xtc(logits: mx.array, coins: mx.array, prob: float, threshold: float, special: list[int]):
    """apply_xtc over the rows, each with its own coin (the same ops, row by row)."""
    probs = mx.softmax(logits, -1)
    mask = probs > mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    if special:
        mask[..., special] = False
    return mx.where(coins > prob, logits, mx.where(mask, -mx.inf, logits))


def _draw(logits: mx.array, temp: float, uniforms: mx.array) -> mx.array:
    """categorical_sampling (`categorical(logits * (1 / temp))`) row by row, as one inverse-CDF
    draw over the rows: MLX's categorical_inverse_cdf with the search as a count."""
    x = (logits * (1.0 / temp)).astype(mx.float32)
    m = x.max(axis=-1, keepdims=True)
    w = mx.where(mx.isinf(m), (x == m).astype(mx.float32), mx.exp(x - m))
    cdf = mx.cumsum(w, axis=-1, reverse=False, inclusive=False)
    totals = mx.stack([w[i].sum() for i in range(w.shape[0])])  # 1-D sums, as MLX's per row
    u = uniforms * totals[:, None]
    return (cdf <= u).sum(axis=-1).astype(mx.uint32) - mx.array(1, mx.uint32)
