"""One request's rows on the engine: build the GenerationRequest (mlx_lm.server's sampler,
processors and stop sequences), submit it, and turn token events into per-choice chunks of
clean text, reasoning and tool calls. Every endpoint (OpenAI, Anthropic, Responses) uses it."""

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.generate import make_text_state_machine

from ..engine import KVBudgetExceeded, Overloaded
from ..engine.request import RequestHandle
from .app import ServerState
from .errors import APIError, bad_request
from .params import GenParams
from .prompt import Prompt
from .provider import Served
from .request_log import prefill_progress
from .row_request import build_request
from .streaming import interleave, offload
from .text import ChoiceText, Delta, ForcedToolText

_machines: dict[tuple[int, tuple[str, ...]], Any] = {}
RETRY_AFTER_MAX = 60  # seconds: past this a client's own backoff knows better


def retry_after(drain_s: float | None) -> int:
    """Retry-After for a full queue: the seconds its waiting requests need to get rows at the
    recent rate (Admission.drain_s), whole, within [1, RETRY_AFTER_MAX]."""
    if drain_s is None or drain_s != drain_s:  # nobody waits now (or no rate: NaN)
        return 1
    return max(1, min(RETRY_AFTER_MAX, math.ceil(min(drain_s, RETRY_AFTER_MAX))))


def text_machine(tokenizer: Any, stop: list[str]) -> Any:
    """mlx-lm's TextStateMachine for this tokenizer and stop words (cached, as mlx_lm.server)."""
    key = (id(tokenizer), tuple(stop))
    if key not in _machines:
        if len(_machines) > 100:
            _machines.clear()
        _machines[key] = make_text_state_machine(tokenizer, stop)
    return _machines[key]


class TimedOut(Exception):
    """The request's --request-timeout passed while its rows ran or waited."""


@dataclass
class TokenInfo:
    id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


@dataclass
class Chunk:
    """What one token (or the end) adds to choice `index`."""

    index: int
    delta: Delta
    tokens: list[TokenInfo] = field(default_factory=list)
    in_tool: bool = False  # mlx_lm.server sends nothing while a tool block is open
    finish: str | None = None  # stop / length / tool_calls, on the choice's last chunk


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    drafted_tokens: int = 0  # draft tokens the model verified (speculative decoding)
    accepted_tokens: int = 0  # of those, the ones it kept


class Generation:
    """The rows of one request (n of them share one prefill)."""

    def __init__(
        self,
        served: Served,
        prompt: Prompt,
        params: GenParams,
        tools: list[dict] | None,
        observer: Any = None,
        endpoint: str = "",
        arrival: Any = None,
    ) -> None:
        self.served, self.prompt, self.params, self.tools = served, prompt, params, tools
        self.arrival = arrival  # the request's arrivals ticket, released right after submit
        self.handles: list[RequestHandle] = []
        self.usage = Usage(prompt_tokens=len(prompt.tokens))
        # Timings as the client sees them (for /metrics): submit -> first token, token gaps.
        self.observer, self.endpoint = observer, endpoint
        if observer is not None:  # before the answer starts: /metrics counts it by model
            observer.started(self)
        self.submitted_at = time.perf_counter()
        self.ttft_s: float | None = None
        self.gaps: list[float] = []
        self._last_at: float | None = None
        self.finish_reasons: list[str] = []
        self.deadline: float | None = None  # the event loop's time when --request-timeout ends it
        self.timeout = 0.0
        self.timed_out = False  # a row ended at the deadline (its "length" is not max_tokens')

    async def start(self, state: ServerState) -> None:
        """Submit (with the server's `state`: its config and KV scheme); refusals become API
        errors (429 queue full, 400 never fits)."""

        def submit() -> list[RequestHandle]:
            try:
                kv_config = state.provider.kv_config
                req = build_request(self.served, self.prompt, self.params, state.config, kv_config)
                self.usage.prompt_tokens = len(req.prompt)  # images' placeholders expanded
                req.prompt_progress_callback = progress  # the request log's (request_log.py)
                engine = self.served.engine
                if self.params.n == 1:
                    return [engine.submit(req, self.arrival)]
                return engine.submit_n(req, self.params.n, self.arrival)
            finally:  # refused (the engine released it as it queued): nothing to wait for
                if self.arrival is not None:
                    self.arrival.release()

        progress = prefill_progress()
        self.submitted_at = time.perf_counter()
        if timeout := state.config.request_timeout:
            self.timeout, self.deadline = timeout, asyncio.get_running_loop().time() + timeout
        try:
            self.handles = await offload(submit)
        except Overloaded as e:
            wait = retry_after(self.served.engine.admission.drain_s())
            raise APIError(429, f"server busy: {e}", headers={"Retry-After": str(wait)}) from e
        except KVBudgetExceeded as e:
            raise bad_request(str(e)) from e
        except ValueError as e:
            raise bad_request(str(e)) from e
        except RuntimeError as e:  # the engine is closing
            raise APIError(503, str(e), headers={"Retry-After": "5"}) from e

    def behind(self) -> bool:
        """Token events are waiting that this request has not turned into chunks yet."""
        return any(h.pending() for h in self.handles)

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    def _choice(self, index: int) -> Any:
        if self.params.forced_tool is not None:
            return ForcedToolText(self.params.forced_tool)
        tok = self.served.tokenizer
        machine = text_machine(tok, self.params.stop)
        stop = self.params.stop
        return ChoiceText(machine, self.prompt.initial_state, tok.tool_parser, self.tools, stop)

    async def _one(self, index: int, handle: RequestHandle) -> AsyncIterator[Chunk]:
        text = self._choice(index)
        last = None  # the finishing token (its text holds the detokenizer's final flush)
        count = kept = 0  # tokens, and accepted draft tokens among them
        try:
            async for ev in self._until_deadline(handle):
                self._stamp()
                count += 1
                kept += ev.from_draft
                info = TokenInfo(ev.token, ev.logprob, ev.top_logprobs)
                if ev.finish is not None:  # sent now, not after the row's cache is stored
                    last = ev
                    yield Chunk(index, text.feed(ev.text, ev.finish), [info], False,
                                text.finish_reason(ev.finish))  # fmt: skip
                    continue
                delta = text.feed(ev.text, None)
                if text.stopped:  # a stop word appeared in the text: the row ends here
                    handle.cancel()
                    self.usage.completion_tokens += count
                    self._drafts(kept, kept)
                    self.usage.cached_tokens = max(self.usage.cached_tokens, handle.cached_tokens)
                    self.finish_reasons.append("stop")
                    yield Chunk(index, delta, [info], False, text.finish_reason("stop"))
                    return
                yield Chunk(index, delta, [info], text.in_tool)
        except TimedOut:  # --request-timeout: the row ends now, as if max_tokens were reached
            handle.cancel()
            self.timed_out = True
            self.usage.completion_tokens += count
            self._drafts(kept, kept)
            self.usage.cached_tokens = max(self.usage.cached_tokens, handle.cached_tokens)
            if last is not None:  # its last token is sent already: only its DoneEvent was late
                self.finish_reasons.append(last.finish)
                return
            if self.ttft_s is None:  # nothing to send: the client may try again later
                wait = retry_after(self.served.engine.admission.drain_s())
                message = f"server busy: no token within --request-timeout ({self.timeout:g} s)"
                raise APIError(429, message, headers={"Retry-After": str(wait)}) from None
            self.finish_reasons.append("length")
            yield Chunk(index, text.feed("", "length"), [], False, text.finish_reason("length"))
            return
        done = handle.done
        self.usage.completion_tokens += done.completion_tokens
        self._drafts(done.drafted_tokens, done.accepted_tokens)
        self.usage.cached_tokens = max(self.usage.cached_tokens, handle.cached_tokens)
        self.finish_reasons.append(done.reason)
        if last is None and done.reason in ("stop", "length"):
            yield Chunk(index, text.feed(done.text, done.reason), [], False, done.reason)

    def _drafts(self, drafted: int, accepted: int) -> None:
        """A row's draft counts; a row cut short before its DoneEvent counts its drafts kept as
        drafted (the ones the model threw away are only in that event)."""
        self.usage.drafted_tokens += drafted
        self.usage.accepted_tokens += accepted

    async def _until_deadline(self, handle: RequestHandle) -> AsyncIterator[Any]:
        """`handle`'s token events; TimedOut once the request's deadline has passed."""
        if self.deadline is None:
            async for ev in handle:
                yield ev
            return
        events = aiter(handle)
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    ev = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise TimedOut from None
            yield ev

    def _ended_normally(self) -> bool:
        reasons = self.finish_reasons
        return len(reasons) == len(self.handles) and not {"error", "cancelled"} & set(reasons)

    def _stamp(self) -> None:
        now = time.perf_counter()
        if self.ttft_s is None:
            self.ttft_s = now - self.submitted_at
        elif self._last_at is not None:
            self.gaps.append(now - self._last_at)
        self._last_at = now

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every choice's chunks, interleaved as they arrive; cancels the rows if abandoned."""
        try:
            if len(self.handles) == 1:
                async for chunk in self._one(0, self.handles[0]):
                    yield chunk
                return
            streams = [self._one(i, h) for i, h in enumerate(self.handles)]
            async with aclosing(interleave(streams)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if any(h.done is None for h in self.handles):
                self.cancel()  # a client that went away frees its rows
            if self.arrival is not None and self._ended_normally():
                self.arrival.replied()  # its client may be back: a new wave may wait for it
            if self.observer is not None:
                self.observer.finished(self)
