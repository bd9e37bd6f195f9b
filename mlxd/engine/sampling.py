"""Per-row sampling built from parameters, with a per-row PRNG stream.

The sampler and logits processors are mlx-lm's (make_sampler, make_logits_processors), so
a row samples exactly as mlx-lm does. A seeded row owns its key: before its sampler runs the
engine thread's key is set to the row's key, and afterwards the row's key advances by the
number of draws that sampler makes (computed on the CPU: no device sync in the step).
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_frequency_penalty,
    make_presence_penalty,
    make_repetition_penalty,
    make_sampler,
)

from . import rng as threefry
from .rng import current_key, set_key

Key = tuple[int, int]


class LogitBias:
    """mlx-lm's logit_bias processor (`make_logits_processors`), op for op, as an object the
    batched step can recognise."""

    def __init__(self, bias: dict[int, float]) -> None:
        self.indices = mx.array(list(bias.keys()))
        self.values = mx.array(list(bias.values()))

    def __call__(self, _tokens: Any, logits: mx.array) -> mx.array:
        return logits.at[:, self.indices].add(self.values)


@dataclass
class SamplingParams:
    """mlx-lm's sampler and logits-processor arguments, with its defaults (0 / None = off)."""

    temp: float = 0.0
    top_p: float = 0.0
    min_p: float = 0.0
    min_tokens_to_keep: int = 1
    top_k: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    xtc_special_tokens: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int | None = 20
    presence_penalty: float | None = None
    presence_context_size: int | None = 20
    frequency_penalty: float | None = None
    frequency_context_size: int | None = 20

    def validate(self) -> None:
        """mlx-lm's samplers check some bounds only when they first run, inside a step that
        other rows share: check them all at submit instead."""
        checks = [
            (self.temp >= 0, "temp must be >= 0"),
            (0 <= self.top_p <= 1, "top_p must be in [0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 <= self.xtc_probability <= 1, "xtc_probability must be in [0, 1]"),
            (0 <= self.xtc_threshold <= 0.5, "xtc_threshold must be in [0, 0.5]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def draws(self) -> int:
        """Keys the sampler takes per token: categorical, plus XTC's coin when it is on."""
        if self.temp == 0:
            return 0
        return 1 + (1 if self.xtc_probability > 0.0 else 0)

    def sampler(self) -> Callable[[mx.array], mx.array]:
        """mlx-lm's sampler; with a temperature, inside a ParamSampler that names its
        parameters (greedy stays mlx-lm's one shared function, which batches as it is)."""
        inner = make_sampler(
            self.temp,
            self.top_p,
            self.min_p,
            self.min_tokens_to_keep,
            top_k=self.top_k,
            xtc_probability=self.xtc_probability,
            xtc_threshold=self.xtc_threshold,
            xtc_special_tokens=self.xtc_special_tokens,
        )
        return inner if self.temp == 0 else ParamSampler(replace(self), inner)  # a snapshot

    def processors(self) -> list[Callable[[mx.array, mx.array], mx.array]]:
        """mlx-lm's processors in its order (make_logits_processors); the bias as a LogitBias,
        the same op, and each penalty as mlx-lm's own closure inside a Penalty that names it,
        so that the batched step can apply every row's in a few batched ops."""
        out: list[Callable[[mx.array, mx.array], mx.array]] = (
            [LogitBias(self.logit_bias)] if self.logit_bias else []
        )
        penalties = [
            ("repetition", make_repetition_penalty, self.repetition_penalty,
             self.repetition_context_size),
            ("presence", make_presence_penalty, self.presence_penalty, self.presence_context_size),
            ("frequency", make_frequency_penalty, self.frequency_penalty,
             self.frequency_context_size),
        ]  # fmt: skip
        for kind, make, penalty, context in penalties:
            if penalty is not None and penalty != 0:
                out.append(Penalty(kind, penalty, context, make(penalty, context)))
        return out


class Penalty:
    """One of mlx-lm's penalty processors, called as it is; `kind`, `penalty` and `context`
    let the batched step apply all rows' penalties of a kind at once (decode_step.py)."""

    def __init__(self, kind: str, penalty: float, context: Any, inner: Callable) -> None:
        self.kind, self.penalty, self.context, self.inner = kind, penalty, context, inner

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        return self.inner(tokens, logits)


class ParamSampler:
    """mlx-lm's sampler for `params`, called as it is; the batched step reads the parameters
    to sample rows with equal ones together (engine/sampling.py)."""

    def __init__(self, params: SamplingParams, inner: Callable[[mx.array], mx.array]) -> None:
        self.params, self.inner = params, inner

    def __call__(self, logprobs: mx.array) -> mx.array:
        return self.inner(logprobs)


def seed_key(seed: int) -> Key:
    """The key `mx.random.seed(seed)` installs (mx.random.key: [seed >> 32, seed & 0xffffffff])."""
    seed &= (1 << 64) - 1
    return seed >> 32, seed & 0xFFFFFFFF


def advance(key: Key, draws: int) -> Key:
    """The key after `draws` calls of MLX's KeySequence.next (split, keep the first half),
    computed on the host: no MLX op, no sync in the step."""
    for _ in range(draws):
        key = threefry.split(key)[0]
    return key


class KeyedSampler:
    """A row's sampler inside a batched step, drawing from the row's own key stream."""

    def __init__(self, sampler: Callable[[mx.array], mx.array], key: Key, draws: int) -> None:
        self.inner, self.key, self.draws = sampler, key, draws

    def __call__(self, logprobs: mx.array) -> mx.array:
        set_key(self.key)
        out = self.inner(logprobs)
        self.key = advance(self.key, self.draws)
        return out


# Rows with different samplers sampled in a few batched calls, each row with its own draw.
#
# When a batch's rows hold different sampler objects (every request with a temperature has its
# own), mlx-lm's GenerationBatch samples row by row: a slice, the filter chain and a `categorical`
# per row, then a concatenate, some 30 ops a row. On a one-row input MLX's `categorical` is an
# inverse-CDF draw: one uniform from the thread's key sequence, scaled by the row's weight sum,
# searched in the row's cumulative weights. Here rows with equal parameters run mlx-lm's filter
# chain (XTC's with a coin per row) and that draw together. Each row's keys are split on the host
# in row order, as mlx-lm's loop advances the key sequence, and all uniforms come from one vmapped
# op; only each row's weight sum stays a per-row op, the same 1-D reduction as MLX's. On the CPU
# this gives mlx-lm's tokens and keys bit for bit (tests/engine/test_batch_sampling.py); elsewhere
# it is opt-in until those tests have run there (`--batched-sampling`).


def default_on() -> bool:
    """Where the batched draw is proven equal to mlx-lm's per-row one: MLX's CPU backend, and
    MLX-CUDA (the tests passed on an H200). Metal waits for its run."""
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
    # The keys mlx-lm's loop would draw with, in row order, split on the host (rng.py):
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
