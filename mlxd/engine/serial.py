"""The B=1 row: mlx-lm's generate_step, op for op, cut into resumable units of work.

A row alternates `advance()` calls with other rows; the ops it enqueues for itself are the
ones generate_step enqueues, in the same order, so its tokens and logprobs are the same bits.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler
from mlx_lm.utils import does_model_support_input_embeddings

from ..kv.convert import converter
from ..store.layers import clone
from .adapters import row_slots
from .output import Readout
from .prefix import Plan
from .request import GenerationRequest


def validate(req: GenerationRequest, model: Any) -> None:
    """generate_step's argument checks, raised at submit time with its messages."""
    if req.max_tokens == 0:
        raise ValueError("Maximum number of tokens must be non-zero (use -1 for no limit).")
    emb, n = req.input_embeddings, len(req.prompt)
    if emb is not None:
        if not does_model_support_input_embeddings(model):
            raise ValueError("Model does not support input embeddings.")
        if n > 0 and n != len(emb):
            raise ValueError(
                f"When providing input_embeddings, their sequence length ({len(emb)}) "
                f"must match the sequence length of the prompt ({n}), or the "
                "prompt must be empty."
            )
    elif n == 0:
        raise ValueError("Either input_embeddings or prompt (or both) must be provided.")


@dataclass
class Step:
    """One decoded token of the serial row: its id, log-probability vector and figures."""

    token: int
    logprobs: mx.array
    read: Readout | None
    from_draft: bool = False  # a drafted token the target accepted (draft_row.py)


class SerialRow:
    """A lone row on plain serial caches. `advance()` does one unit: a prefill chunk or a step."""

    # mlx-lm's mx.clear_cache() after each prefill chunk and every 256 tokens; the engine turns
    # it off where a clear is slow (CUDA: EngineConfig.clear_cache). Buffers only, same bits.
    clears: bool = True
    # A driver's row (engine/driver.py) keeps the key its last draw left, for a hand-over.
    keeps_key: bool = False

    def __init__(
        self,
        model: Any,
        req: GenerationRequest,
        stream: Any,
        plan: Plan | None = None,
        snapshot: Callable[[int, list[Any]], None] | None = None,
    ) -> None:
        """`plan`: start from a stored prefix and call `snapshot(position, cache)` at its cuts."""
        self.model, self.req, self.stream = model, req, stream
        self.plan, self.snapshot = plan, snapshot
        self.cache = plan.cache if plan is not None and plan.cache is not None else None
        if self.cache is None:
            self.cache = req.prompt_cache or make_prompt_cache(model, max_kv_size=req.max_kv_size)
        self.quantize = converter(req)
        self.sampler = req.sampler or greedy_sampler
        self.processors = req.logits_processors
        self.progress = req.prompt_progress_callback or (lambda *_: None)
        self.loose: list[mx.array] = []  # built in a turn, in no scheduled graph (_schedule)
        self._track_key()
        start = plan.start if plan is not None else 0
        self.cuts = [c for c, _ in plan.cuts] if plan is not None else []
        emb = req.input_embeddings
        self.total = len(emb) if emb is not None else len(req.prompt)
        # A stored prefix holds the first `start` positions: the rest of the prompt and its
        # embeddings are fed (Qwen-VL slices its positions by the cache's offset itself).
        self.prompt, self.emb = (
            req.prompt[start:],
            emb[start:] if emb is not None and start else emb,
        )
        self.processed = self.fed = start  # prompt tokens prefilled / all tokens in the cache
        # History the logits processors see: the whole prompt, a stored prefix included.
        self.tokens: mx.array | None = (
            req.prompt[:start] if start and req.logits_processors else None
        )
        self.y: mx.array | None = None  # pipeline register: the token being computed
        self.logprobs: mx.array | None = None
        self.read: Readout | None = None  # its logprob figures, when asked (same graph)
        self.n = 0
        self.emitted: list[int] = []  # tokens handed to the caller (the engine appends)
        self.clear_due = False
        self.progress(0, self.total)

    @classmethod
    def resume(
        cls,
        model: Any,
        req: GenerationRequest,
        stream: Any,
        cache: list[Any],
        pending: tuple[mx.array, mx.array],
        history: list[int],
        emitted: list[int],
        processors: list[Any] | None = None,
    ) -> "SerialRow":
        """A row leaving a batch: its (unpadded) caches, its sampled-but-unfed token and that
        token's logprobs, the tokens in its cache, and what it has emitted so far."""
        row = cls.__new__(cls)
        row.model, row.req, row.stream, row.cache = model, req, stream, cache
        row.plan, row.snapshot, row.cuts = None, None, []
        row.fed = len(history)
        row.quantize = converter(req)  # a row that has not converted yet converts here
        row.loose = []
        row.sampler = req.sampler or greedy_sampler
        row.processors = processors if processors is not None else req.logits_processors
        row._track_key()
        row.progress = lambda *_: None
        row.prompt, row.emb = mx.array([], dtype=mx.int32), None
        row.total = row.processed = len(req.prompt)
        row.tokens = mx.array(history) if row.processors else None
        row.y, row.logprobs = pending
        row.read = None  # the batch's pending token: RowOutput builds its figures
        row.n, row.emitted = len(emitted), list(emitted)
        row.clear_due = False
        return row

    def _call(self, tokens: mx.array, emb: mx.array | None) -> mx.array:
        self.fed += tokens.shape[1]
        with row_slots(self.req.adapter_slots, lambda: (self.req.adapter,)):
            if emb is not None:
                extra = self.req.model_kwargs or {}
                return self.model(tokens, cache=self.cache, input_embeddings=emb, **extra)
            return self.model(tokens, cache=self.cache)

    def _step(self, tokens: mx.array, emb: mx.array | None = None) -> tuple[mx.array, mx.array]:
        with mx.stream(self.stream):
            logits = self._call(tokens[None], emb[None] if emb is not None else None)[:, -1, :]
            procs = self.processors
            if procs and len(tokens) > 0:
                self.tokens = tokens if self.tokens is None else mx.concat([self.tokens, tokens])
                for processor in procs:
                    logits = processor(self.tokens, logits)
            self._convert()
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return self.sampler(logprobs), logprobs.squeeze(0)

    def _convert(self) -> None:
        """mlx-lm's KV conversion; layers it converts are loose until the next step uses them."""
        if self.req.kv_bits is None and self.req.kv_config is None:
            return  # nothing to convert: no per-step cost
        before = list(self.cache)
        self.quantize(self.cache)
        self.loose += [a for c, b in zip(self.cache, before, strict=True) if c is not b
                       for a in tree_flatten(c.state)]  # fmt: skip

    def _track_key(self) -> None:
        """A driver's row with a key of its own (rng.KeyOwner) whose step may draw keeps, in
        `key`, the key its last draw left. Greedy without processors never draws: no read of
        MLX's random state per step (which waits on a busy stream)."""
        self.draws = self.req.random_key is not None and (
            self.sampler is not greedy_sampler or bool(self.processors)
        )
        self.key: mx.array | None = None

    def _schedule(self, *arrays: mx.array) -> None:
        """mx.async_eval of the step's arrays and, in the same call, what else the turn built
        lazily (the PRNG key a draw split, converted KV): MLX streams are per thread, so
        another thread can take the row after any turn (engine/driver.py)."""
        if self.draws and self.keeps_key:
            self.key = mx.random.state[0]
            self.loose.append(self.key)
        mx.async_eval(*arrays, *self.loose)
        self.loose = []

    @property
    def prefilling(self) -> bool:
        return self.y is None

    def prefill_chunk(self) -> None:
        """One chunk of prompt (all but the last token, as generate_step), or the first step."""
        with mx.stream(self.stream):
            if self.total - self.processed > 1:
                n = min(self.req.prefill_step_size, self.total - self.processed - 1)
                if self.cuts:  # a snapshot point ends the chunk (mlx-lm's segments)
                    n = min(n, self.cuts[0] - self.processed)
                chunk = self.prompt[:n]
                self._call(chunk[None], self.emb[:n][None] if self.emb is not None else None)
                self.quantize(self.cache)
                if self.processors and len(chunk) > 0:
                    self.tokens = chunk if self.tokens is None else mx.concat([self.tokens, chunk])
                self.prompt = self.prompt[n:]
                self.emb = self.emb[n:] if self.emb is not None else None
                # The rest of the prompt with the cache: nothing of this turn is left lazy.
                rest = [a for a in (self.prompt, self.emb, self.tokens) if a is not None]
                mx.eval([c.state for c in self.cache], rest)
                self.processed += n
                self.progress(self.processed, self.total)
                if self.cuts and self.processed == self.cuts[0]:
                    self.cuts.pop(0)
                    if self.snapshot is not None:
                        self.snapshot(self.processed, clone(self.cache))
                if self.clears:
                    mx.clear_cache()
                return
            self.y, self.logprobs = self._step(self.prompt, self.emb)
            self.read = Readout.build(self.req, self.y, self.logprobs)
            self._schedule(self.y, self.logprobs, *(self.read.arrays() if self.read else ()))

    def decode(self) -> Step | None:
        """Dispatch the next step, then read back the current token (None when max reached)."""
        req = self.req
        if self.clear_due:  # mlx-lm clears after its yield: the token went out first
            self.clear_due = False
            mx.clear_cache()
        if self.n != req.max_tokens:
            next_y, next_lp = self._step(self.y)
            next_read = Readout.build(req, next_y, next_lp)
            self._schedule(next_y, next_lp, *(next_read.arrays() if next_read else ()))
        if self.n == 0:
            mx.eval(self.y)
            self.progress(self.total, self.total)
        if self.n == req.max_tokens:
            return None
        step = Step(self.y.item(), self.logprobs, self.read)
        self.clear_due = self.n % 256 == 0 and self.clears  # done at the next decode()
        self.y, self.logprobs, self.read = next_y, next_lp, next_read
        self.n += 1
        return step

    def handoff(self) -> tuple[list[int], list[int], mx.array | None]:
        """Stop here so the batch can continue this row: (tokens to feed next, tokens already
        in the cache, the pending token's logprobs). The pending token is not yet emitted."""
        prompt = self.req.prompt.tolist()
        if self.prefilling:
            return self.prompt.tolist(), prompt[: self.processed], None
        y = self.y.item()
        return [y], prompt, self.logprobs
