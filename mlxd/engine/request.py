"""What crosses into the engine (a request) and what comes back (events), as small dataclasses."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass
class GenerationRequest:
    """One row's work: mlx-lm's generate_step arguments, unchanged in meaning and default."""

    prompt: mx.array
    max_tokens: int = 256
    sampler: Sampler | None = None
    logits_processors: list[LogitsProcessor] | None = None
    max_kv_size: int | None = None
    prompt_cache: list[Any] | None = None
    prefill_step_size: int = 2048
    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = 5000
    input_embeddings: mx.array | None = None
    prompt_progress_callback: Callable[[int, int], None] | None = None
    stop_token_ids: frozenset[int] = frozenset()  # the row ends after emitting one of these
    # The caller thread's PRNG key (MLX keys are per thread): samplers that draw from the
    # global key see the same sequence in the engine thread as they would in the caller's.
    random_key: tuple[int, int] | None = None


@dataclass
class TokenEvent:
    """One generated token and its full log-probability vector (after logits processors)."""

    token: int
    logprobs: mx.array


@dataclass
class DoneEvent:
    """The row ended: `length` (max_tokens reached), `cancelled`, or `error` with the exception."""

    reason: str
    error: BaseException | None = None
    random_key: tuple[int, int] | None = None  # the row's PRNG key at its end
    timings: dict[str, float] = field(default_factory=dict)
