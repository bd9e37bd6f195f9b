"""What crosses into the engine (a request) and what comes back (events), as small dataclasses."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx

if TYPE_CHECKING:
    from .sampling import SamplingParams

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
    kv_config: Any = None  # mixed per-layer KV (kv.mixed.MixedKV, mlx-optiq's kv_config)
    # Quantize sliding-window layers too (mlx-lm raises "RotatingKVCache Quantization NYI").
    quantize_windows: bool = False
    input_embeddings: mx.array | None = None
    prompt_progress_callback: Callable[[int, int], None] | None = None
    stop_token_ids: frozenset[int] = frozenset()  # the row ends after emitting one of these
    # Multi-token stop sequences (mlx-lm's StopSequences: Aho-Corasick over token ids).
    stop_sequences: list[list[int]] = field(default_factory=list)
    # Built into `sampler` / `logits_processors` when those are not given.
    sampling: "SamplingParams | None" = None
    seed: int | None = None  # the row's own PRNG stream; same as mx.random.seed(seed) at B=1
    draws: int | None = None  # keys the sampler takes per token (None: unknown, a user sampler)
    return_prompt_cache: bool = False  # hand the row's caches back in its DoneEvent
    n: int = 1  # rows sampled from this prompt, prefilled once (Engine.submit_n)
    # The caller thread's PRNG key (MLX keys are per thread): samplers that draw from the
    # global key see the same sequence in the engine thread as they would in the caller's.
    random_key: tuple[int, int] | None = None
    logprob: bool = False  # put the sampled token's log-probability on each TokenEvent
    top_logprobs: int = 0  # and the k most likely (id, logprob) pairs, mlx_lm.server's order
    # The prefix store: start from the longest stored prefix, snapshot at these prompt positions
    # (e.g. the end of the system prompt) besides the prompt minus its last token.
    use_prefix_store: bool = True
    snapshot_at: tuple[tuple[int, str], ...] = ()  # (position, kind: system / user / assistant)
    cached_tokens: int = 0  # set by the engine: prompt tokens served from the store
    # Detokenize this row with this tokenizer on the engine thread, beside the step (as mlx-lm's
    # loop does beside its own); None: with the engine's tokenizer, if it has one.
    tokenizer: Any = None


@dataclass
class TokenEvent:
    """One generated token, its full log-probability vector (after logits processors), and
    the text it completes (empty unless the engine has a tokenizer)."""

    token: int
    logprobs: mx.array
    text: str = ""
    finish: str | None = None  # the reason this token ends the row ("stop" / "length"), if it does
    logprob: float | None = None  # when the request asked for it
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class DoneEvent:
    """The row ended: `length` (max_tokens reached), `cancelled`, or `error` with the exception."""

    reason: str
    error: BaseException | None = None
    random_key: tuple[int, int] | None = None  # the row's PRNG key at its end
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served by the prefix store
    text: str = ""  # the detokenizer's final flush
    prompt_cache: list[Any] | None = None  # when the request asked for it
    timings: dict[str, float] = field(default_factory=dict)
