"""What crosses into the engine (a request, its arrays evaluated first) and what comes back
(events, read through the caller's handle), as small dataclasses."""

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

if TYPE_CHECKING:
    from .adapters import EngineAdapters
    from .sampling import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass
class Speculation:
    """How a row drafts tokens for the target to verify: `ngram` looks its own prompt and output
    up, `prediction` follows the given tokens (OpenAI Predicted Outputs) and falls back to
    `ngram`, `model` drafts with the engine's draft model (all three in the batched step,
    engine/speculate/); `draft` runs the engine's draft model with mlx-lm's
    speculative_generate_step, alone (engine/draft_row.py). Sample-and-match keeps the
    output's distribution either way."""

    mode: str = "ngram"  # "ngram" | "prediction" | "model" | "draft"
    max_draft: int = 8  # batched modes: a ceiling the per-row gate picks under; draft: k
    prediction: list[int] | None = None  # the predicted output's tokens (mode "prediction")


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
    # Keyword arguments for the model calls that carry `input_embeddings` (a vision model's
    # position ids and rope deltas: mlxd.model.vision); the decode steps get none.
    model_kwargs: dict[str, Any] | None = None
    # The prefix store's key for a prompt with images: `prompt` with each image's patch tokens
    # replaced by negative ids derived from its pixels' digest (serve/vision_rows.py); a row with
    # `input_embeddings` and no key stays out of the store.
    cache_key: list[int] | None = None
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
    speculation: Speculation | None = None  # draft and verify several tokens a step
    adapter: str | None = None  # the name of an adapter loaded in the engine; None: the base
    # The grammar's Constraint (mlxd.constrain) behind a processor in `logits_processors`: what
    # an engine in another process rebuilds that processor from. The engine here ignores it.
    constraint: Any = None
    # set by the engine at submit: its adapters, which each model call of this row sets first
    adapter_slots: "EngineAdapters | None" = field(default=None, repr=False, compare=False)


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
    from_draft: bool = False  # a drafted token the target accepted (mlx-lm's from_draft)


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
    drafted_tokens: int = 0  # draft tokens the target verified for this row
    accepted_tokens: int = 0  # of those, the ones it kept (each emitted as a token)


# The caller's side of a submitted request: a stream of events, usable from threads or asyncio.

Event = TokenEvent | DoneEvent
Watchers = list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]  # async readers to wake


def wake(watchers: Watchers) -> None:
    """Set the readers' flags, with one thread-safe call (one self-pipe write) per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for loop, flag in watchers:
        by_loop.setdefault(loop, []).append(flag)
    for loop, flags in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, flags)
        except RuntimeError:  # that event loop is closed: nobody is waiting there any more
            pass


def _set_all(flags: list[asyncio.Event]) -> None:
    for flag in flags:
        flag.set()


class RequestHandle:
    """Iterate for TokenEvents (blocking or `async for`); `done` holds the final DoneEvent."""

    on_done: Callable[[], None] | None = None  # run once as the DoneEvent is put (adapters.py)

    def __init__(self) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()
        self.done: DoneEvent | None = None
        self.submitted = time.perf_counter()
        self.arrived: float | None = None  # when its request reached the server (a Ticket's)
        self.cached_tokens = 0  # prompt tokens the prefix store served (set at admission)
        self.admitted = False  # the engine took the row: cached_tokens is final

    # engine side
    def admit(self, cached_tokens: int) -> None:
        """The row is admitted, `cached_tokens` of its prompt from the prefix store."""
        self.cached_tokens, self.admitted = cached_tokens, True

    def put(self, event: Event) -> None:
        self._events.put(event)
        if self.on_done is not None and isinstance(event, DoneEvent):
            self.run_on_done()
        if watchers := self._watching():
            wake(watchers)

    def put_quiet(self, event: Event) -> Watchers:
        """Queue `event` without waking anyone; the caller passes the result to `wake` (one
        wake-up per event loop for a whole batched step, not one per row)."""
        self._events.put(event)
        if self.on_done is not None and isinstance(event, DoneEvent):
            self.run_on_done()
        return self._watching()

    def run_on_done(self) -> None:
        done, self.on_done = self.on_done, None
        if done is not None:
            done()

    def _watching(self) -> Watchers:
        if not self._watchers:  # a thread reader: no lock (an async reader re-checks the queue
            return []  # after registering, so one added just now sees this event anyway)
        with self._lock:
            return list(self._watchers)

    def pending(self) -> bool:
        """Events are queued that the reader has not taken yet (it is behind the engine)."""
        return not self._events.empty()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # caller side
    def cancel(self) -> None:
        """Ask the engine to drop the row at its next safe point (frees its caches)."""
        self._cancel.set()

    def _finish(self, event: DoneEvent) -> None:
        self.done = event
        if event.reason == "error" and event.error is not None:
            raise event.error

    def wait(self) -> DoneEvent:
        """Block until the row has ended (dropping any unread tokens); its DoneEvent."""
        for _ in self:
            pass
        assert self.done is not None
        return self.done

    def poll(self) -> TokenEvent | None:
        """The next token event if one is queued (a DoneEvent ends the row: None, `done` set)."""
        while self.done is None:
            if self._events.empty():  # the driver's usual case: cheaper than raising Empty
                return None
            event = self._events.get_nowait()  # only this reader takes: it is still there
            if isinstance(event, DoneEvent):
                self._finish(event)
            else:
                return event
        return None

    def __iter__(self) -> Iterator[TokenEvent]:
        while self.done is None:
            event = self._events.get()
            if isinstance(event, DoneEvent):
                self._finish(event)
            else:
                yield event

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        flag = asyncio.Event()
        with self._lock:
            self._watchers.append((asyncio.get_running_loop(), flag))
        while self.done is None:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                flag.clear()
                if self._events.empty():
                    await flag.wait()
                continue
            if isinstance(event, DoneEvent):
                self._finish(event)
            else:
                yield event


# Evaluate a caller's lazy arrays before they cross to the engine thread.


def materialize(*trees: Any) -> None:
    """Evaluate every array reachable from modules/caches in the calling thread.

    MLX streams are per thread: a lazy array built in the caller (e.g. a rope module's private
    `_freqs`) cannot be evaluated on the engine thread, so it is computed here first.
    """
    arrays: list[mx.array] = []
    seen: set[int] = set()

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, mx.array):
            arrays.append(x)
        elif isinstance(x, dict | list | tuple):
            for v in x.values() if isinstance(x, dict) else x:
                visit(v)
        elif hasattr(x, "__dict__") and not callable(x) or isinstance(x, nn.Module):
            for v in vars(x).values():
                visit(v)
            if isinstance(x, nn.Module):
                for v in x.values():
                    visit(v)

    for tree in trees:
        visit(tree)
    mx.eval(arrays)
