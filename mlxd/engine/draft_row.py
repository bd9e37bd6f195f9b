"""The draft-model row: mlx-lm's speculative_generate_step, op for op, cut into resumable units.

Prefill chunks (the draft's prompt, then the target's, each all but its last token), then verify
cycles: the draft model proposes k tokens one at a time, the target scores [y, drafts...] in one
forward, every position is sampled, the matching prefix is kept and both caches are trimmed back.
`decode()` hands out one token a call from the cycle's buffer. The row runs alone, never in a
batch (mlx_lm.server serves a draft model one request at a time).
"""

import functools
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from .request import DoneEvent, GenerationRequest
from .serial import Step


def drafts(req: GenerationRequest) -> bool:
    """The request drafts with the engine's draft model (a DraftRow)."""
    return req.speculation is not None and req.speculation.mode == "draft"


class DraftRow:
    """A lone row with SerialRow's interface: `prefill_chunk()` while `prefilling`, then
    `decode()`, one token a call (None once mlx-lm's generator would have ended)."""

    clears: bool = True  # mlx-lm's mx.clear_cache() after each prefill chunk (buffers only)
    keeps_key: bool = False  # a driver's row keeps the key its last draw left (driver.py)
    plan = None  # no prefix store: the row starts from its own (or the caller's) caches
    cuts: tuple[int, ...] = ()

    def __init__(self, model: Any, draft_model: Any, req: GenerationRequest, stream: Any) -> None:
        if req.input_embeddings is not None:
            raise ValueError("Speculative decoding does not support input embeddings.")
        if req.kv_config is not None:  # a per-layer scheme names the target's layers only
            raise ValueError("kv_config does not run with a draft model.")
        self.model, self.draft_model, self.req, self.stream = model, draft_model, req, stream
        self.k = req.speculation.max_draft if req.speculation is not None else 2
        self.y = req.prompt.astype(mx.uint32)  # the target's tokens to feed
        self.draft_y = self.y  # the draft's
        if req.prompt_cache is None:
            self.model_cache = make_prompt_cache(model)
            self.draft_cache = make_prompt_cache(draft_model)
        else:  # mlx-lm's layout: the target's layers, then the draft's
            self.model_cache = req.prompt_cache[: len(model.layers)]
            self.draft_cache = req.prompt_cache[len(model.layers) :]
        if not can_trim_prompt_cache(self.model_cache):
            types = {type(c).__name__ for c in self.model_cache if not c.is_trimmable()}
            raise ValueError(
                f"Speculative decoding requires a trimmable prompt cache (got {types})."
            )
        self.sampler = req.sampler or greedy_sampler
        self.processors = req.logits_processors
        self.quantize = functools.partial(
            maybe_quantize_kv_cache,
            quantized_kv_start=req.quantized_kv_start,
            kv_group_size=req.kv_group_size,
            kv_bits=req.kv_bits,
        )
        self.progress = req.prompt_progress_callback or (lambda *_: None)
        self.prev: mx.array | None = None  # the tokens the processors see (mlx-lm's prev_tokens)
        self.loose: list[mx.array] = []  # converted KV no step has used yet (thread hand-off)
        self.draws = req.random_key is not None and (
            self.sampler is not greedy_sampler or bool(self.processors)
        )
        self.key: mx.array | None = None  # its last drawn key, for a driver's hand-over
        self.total = len(req.prompt)
        self.processed = self.fed = 0  # the target's prompt tokens prefilled (stats, store)
        self.emitted: list[int] = []  # tokens handed to the caller (the engine appends)
        # The current verify cycle: its draft count, tokens and drafts, accepted tokens handed
        # out (mlx-lm's n), and what is still to hand out.
        self.num_draft = self.n = self.ntoks = 0
        self.tokens: list[int] = []
        self.drafted_ids: list[int] = []
        self.buffer: list[tuple[int, mx.array, bool]] = []
        self.open = False  # a cycle whose caches are not yet rewound
        self.ended = False  # mlx-lm's loop broke at max_tokens
        self.drafted = self.accepted = 0  # for the DoneEvent
        self.prefill = self.y.size > 1
        self.progress(0, self.total)

    @property
    def cache(self) -> list[Any]:
        """mlx-lm's combined prompt cache: the target's layers, then the draft's."""
        return self.model_cache + self.draft_cache

    @property
    def prefilling(self) -> bool:
        return self.prefill  # (after a cycle the draft's input can be two tokens)

    def prefill_chunk(self) -> None:
        """One chunk: the draft's prompt first, then the target's (mlx-lm's two _prefill)."""
        with mx.stream(self.stream):
            if self.draft_y.size > 1:
                self.draft_y = self._chunk(self.draft_model, self.draft_cache, self.draft_y)
                return
            if self.y.size > 1:
                n = self.y.size
                self.y = self._chunk(self.model, self.model_cache, self.y)
                self.processed += n - self.y.size
                self.fed = self.processed
                self.progress(self.processed, self.total)
            self.prefill = self.draft_y.size > 1 or self.y.size > 1

    def _chunk(self, model: Any, cache: list[Any], y: mx.array) -> mx.array:
        n = min(self.req.prefill_step_size, y.size - 1)
        model(y[:n][None], cache=cache)
        self.quantize(cache)
        y = y[n:]
        mx.eval([c.state for c in cache], y)  # the rest of the prompt too: nothing left lazy
        if self.clears:
            mx.clear_cache()
        return y

    def decode(self) -> Step | None:
        """The next token of the current cycle; a new cycle when it is spent."""
        if not self.buffer:
            if self.ended:
                return None
            if self.open:
                self._next_inputs()
            with mx.stream(self.stream):
                self._cycle()
        token, logprobs, from_draft = self.buffer.pop(0)
        if from_draft:
            self.n += 1
            self.accepted += 1
        return Step(token, logprobs, None, from_draft)

    def _cycle(self) -> None:
        """Draft, verify, and buffer what mlx-lm's loop yields for this cycle."""
        req = self.req
        num_draft = min(req.max_tokens - self.ntoks, self.k)
        draft_tokens = self._draft_generate(self.draft_y, num_draft)
        if self.prev is not None:
            self.prev = self.prev[: self.prev.size - self.y.size - num_draft + 1]
        y = mx.concatenate([self.y, draft_tokens])
        tokens, logprobs = self._step(self.model, self.model_cache, y, num_draft + 1)
        rows = [logprobs[i] for i in range(num_draft + 1)]  # views, what mlx-lm yields
        if self.draws and self.keeps_key:
            self.key = mx.random.state[0]
            self.loose.append(self.key)
        lazy = [a for a in (self.prev,) if a is not None]
        mx.eval(tokens, draft_tokens, rows, self.loose, lazy)
        self.loose = []
        self.num_draft, self.n, self.open = num_draft, 0, True
        self.drafted += num_draft
        self.drafted_ids, self.tokens = draft_tokens.tolist(), tokens.tolist()
        n, ntoks = 0, self.ntoks
        while n < num_draft:
            if self.tokens[n] != self.drafted_ids[n]:
                break
            self.buffer.append((self.tokens[n], rows[n], True))
            n, ntoks = n + 1, ntoks + 1
            if ntoks == req.max_tokens:
                break
        if ntoks < req.max_tokens:
            ntoks += 1
            self.buffer.append((self.tokens[n], rows[n], False))
        self.ntoks, self.ended = ntoks, ntoks == req.max_tokens
        if self.ntoks == len(self.buffer):
            self.progress(self.total, self.total)  # the first cycle: the prompt is done

    def _next_inputs(self) -> None:
        """mlx-lm's loop after a cycle's last yield: the next inputs, the caches rewound."""
        n, num_draft = self.n, self.num_draft
        self.y = mx.array([self.tokens[n]], mx.uint32)
        self.draft_y = self.y
        if n == num_draft:  # all accepted: the last draft token is not in the draft's cache
            self.draft_y = mx.concatenate([mx.array(self.drafted_ids[-1:], mx.uint32), self.y])
        if self.prev is not None:
            self.prev = self.prev[: -max(num_draft - n, 1)]
        self._rewind()

    def _rewind(self) -> None:
        self.open = False
        trim_prompt_cache(self.model_cache, self.num_draft - self.n)
        trim_prompt_cache(self.draft_cache, max(self.num_draft - self.n - 1, 0))

    def finish(self, done: DoneEvent) -> None:
        """The row ended: mlx-lm's `finally` rewind of the open cycle, and the draft counts."""
        if self.open:
            self._rewind()
        done.drafted_tokens, done.accepted_tokens = self.drafted, self.accepted

    # mlx-lm's closures, as methods
    def _draft_generate(self, y: mx.array, num_draft: int) -> mx.array:
        if num_draft == 0:
            return mx.array([], mx.uint32)
        ys = []
        for _ in range(num_draft):
            y, _ = self._step(self.draft_model, self.draft_cache, y)
            mx.async_eval(y)
            ys.append(y)
        return mx.concatenate(ys)

    def _step(
        self, model: Any, cache: list[Any], y: mx.array, n_predict: int = 1
    ) -> tuple[mx.array, mx.array]:
        logits = model(y[None], cache=cache)
        logits = logits[:, -n_predict:, :]
        self._convert(cache)
        if not self.processors:
            return self._sample(None, logits.squeeze(0))
        out_y, out_logprobs = [], []
        if n_predict > 1:
            y = y[: -(n_predict - 1)]
        for i in range(n_predict):
            self.prev = mx.concatenate([self.prev, y]) if self.prev is not None else y
            y, logprobs = self._sample(self.prev, logits[:, i, :])
            out_y.append(y)
            out_logprobs.append(logprobs)
        return mx.concatenate(out_y, axis=0), mx.concatenate(out_logprobs, axis=0)

    def _sample(self, tokens: mx.array | None, logits: mx.array) -> tuple[mx.array, mx.array]:
        for processor in self.processors or ():
            logits = processor(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs), logprobs

    def _convert(self, cache: list[Any]) -> None:
        """maybe_quantize_kv_cache; layers it converts are loose until a step uses them."""
        if self.req.kv_bits is None:
            return
        before = list(cache)
        self.quantize(cache)
        self.loose += [a for c, b in zip(cache, before, strict=True) if c is not b
                       for a in tree_flatten(c.state)]  # fmt: skip
