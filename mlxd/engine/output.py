"""What a row hands back: token events with text deltas, stop and length checks, and the
final event with usage and timings. One class for serial and batched rows, so both end alike."""

import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import StopSequences

from .request import DoneEvent, GenerationRequest, TokenEvent
from .sampling import seed_key


def _top(logprobs: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """mlx_lm.server's top tokens: `argpartition` order (unsorted), as its response shows them."""
    ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
    return ids, logprobs[ids]


@dataclass
class Readout:
    """The logprob figures a request asked for, built in the step's graph next to its token:
    reading them back adds no ops (otherwise a gather and an argpartition, evaluated and waited
    for once per token and row). A row's first batched token (from mlx-lm's prompt batch) and
    a batch on mlx-lm's own step (a caller's processor) build theirs after the step."""

    picked: mx.array | None = None  # the sampled token's log-probability, shape (1,)
    top: tuple[mx.array, mx.array] | None = None  # top_logprobs' ids and values

    @classmethod
    def build(cls, req: GenerationRequest, y: mx.array, logprobs: mx.array) -> "Readout | None":
        """`y`: the sampled token (1,); `logprobs`: its vector (vocab,). None when not asked."""
        if not req.logprob and req.top_logprobs <= 0:
            return None
        return cls.of(req.logprob, req.top_logprobs, y, logprobs)

    @classmethod
    def of(cls, logprob: bool, k: int, y: mx.array, logprobs: mx.array) -> "Readout":
        return cls(logprobs[y] if logprob else None, _top(logprobs, k) if k > 0 else None)

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.picked, *(self.top or ())) if a is not None]


def prepare(req: GenerationRequest) -> None:
    """Resolve parameters into mlx-lm's sampler / processors and the seed into a key (caller
    thread, before submit returns, so a bad parameter raises there)."""
    req.draws = None
    if req.sampling is not None:
        req.sampling.validate()
        if req.sampler is None:
            req.sampler = req.sampling.sampler()
            req.draws = req.sampling.draws
        if req.logits_processors is None:
            req.logits_processors = req.sampling.processors() or None
    elif req.sampler is None:
        req.draws = 0  # greedy
    if req.seed is not None:
        req.random_key = seed_key(req.seed)


class RowOutput:
    """Per-row bookkeeping on the engine thread."""

    def __init__(self, req: GenerationRequest, tokenizer: Any | None, submitted: float) -> None:
        self.req = req
        singles = [[t] for t in sorted(req.stop_token_ids)]
        self.stops = StopSequences(singles + [list(s) for s in req.stop_sequences if s])
        self.matcher = self.stops.matcher()
        tokenizer = req.tokenizer if req.tokenizer is not None else tokenizer
        self.detok = tokenizer.detokenizer if tokenizer is not None else None  # a fresh copy
        self.flushed = False
        self.count = 0
        self.times = {"submitted": submitted, "admitted": time.perf_counter()}

    def token(
        self, token: int, logprobs: mx.array, read: Readout | None = None
    ) -> tuple[TokenEvent, str | None]:
        """The event for one generated token and the finish reason it causes, if any. `read`:
        its logprob figures from the step's graph (else built here, from `logprobs`)."""
        self.count += 1
        if self.count == 1:
            self.times["first_token"] = time.perf_counter()
        stop = self.matcher.advance(token)
        text = ""
        if self.detok is not None and token not in self.req.stop_token_ids:
            self.detok.add_token(token)
            text = self.detok.last_segment
        reason = "stop" if stop else None
        if reason is None and self.count == self.req.max_tokens:
            reason = "length"
        if reason is not None:  # the detokenizer's last flush rides on the finishing token,
            text += self._flush()  # so a server sends it before the row's cache is stored
        event = TokenEvent(token, logprobs, text, reason)
        if self.req.logprob:
            picked = read.picked if read is not None else None
            event.logprob = (picked if picked is not None else logprobs[token]).item()
        if (k := self.req.top_logprobs) > 0:
            ids, values = read.top if read is not None and read.top else _top(logprobs, k)
            event.top_logprobs = list(zip(ids.tolist(), values.tolist(), strict=True))
        return event, reason

    def _flush(self) -> str:
        """The detokenizer's remaining text, once (finalize, then its last segment)."""
        if self.detok is None or self.flushed:
            return ""
        self.flushed = True
        self.detok.finalize()
        return self.detok.last_segment

    def done(self, reason: str, error: BaseException | None = None) -> DoneEvent:
        text = self._flush() if error is None else ""
        t = self.times
        t["finished"] = time.perf_counter()
        first = t.get("first_token", t["finished"])
        timings = {
            "queue_s": t["admitted"] - t["submitted"],
            "ttft_s": first - t["submitted"],
            "decode_s": t["finished"] - first,
        }
        return DoneEvent(
            reason,
            error,
            prompt_tokens=len(self.req.prompt),
            completion_tokens=self.count,
            cached_tokens=self.req.cached_tokens,
            text=text,
            timings=timings,
        )
