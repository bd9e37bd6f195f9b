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
    make_frequency_penalty,
    make_presence_penalty,
    make_repetition_penalty,
    make_sampler,
)

from . import threefry
from .rng import set_key

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
    let the batched step apply all rows' penalties of a kind at once (batch_penalties.py)."""

    def __init__(self, kind: str, penalty: float, context: Any, inner: Callable) -> None:
        self.kind, self.penalty, self.context, self.inner = kind, penalty, context, inner

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        return self.inner(tokens, logits)


class ParamSampler:
    """mlx-lm's sampler for `params`, called as it is; the batched step reads the parameters
    to sample rows with equal ones together (engine/batch_sampling.py)."""

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
