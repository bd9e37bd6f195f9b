"""A completions request with several prompts (OpenAI's `prompt` as a list): one Generation
per prompt, all queued in one engine call so they are admitted together and prefill in one
wave, read as one request: choice i * n + j is prompt i's row j, usage sums the prompts'."""

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from ..engine import KVBudgetExceeded, Overloaded
from ..engine.request import RequestHandle
from .app import ServerState
from .errors import APIError, bad_request
from .generation import Chunk, Generation, Usage, retry_after
from .row_request import build_request
from .streaming import interleave, offload


class Generations:
    """The Generations of one request's prompts, with Generation's interface."""

    def __init__(self, gens: list[Generation], arrival: Any = None) -> None:
        self.gens, self.arrival = gens, arrival
        self.n = max(gens[0].params.n, 1)

    @property
    def usage(self) -> Usage:
        total = Usage()
        for g in self.gens:
            total.prompt_tokens += g.usage.prompt_tokens
            total.completion_tokens += g.usage.completion_tokens
            total.cached_tokens += g.usage.cached_tokens
            total.drafted_tokens += g.usage.drafted_tokens
            total.accepted_tokens += g.usage.accepted_tokens
        return total

    async def start(self, state: ServerState) -> None:
        """Every prompt's rows queued at once (all or none); refusals as Generation.start's."""
        gens, n = self.gens, self.n
        engine = gens[0].served.engine

        def submit() -> list[list[RequestHandle]]:
            try:
                kv = state.provider.kv_config
                reqs = [build_request(g.served, g.prompt, g.params, state.config, kv) for g in gens]
                if n == 1:  # one admission round: one batch composition
                    return [[h] for h in engine.submit_many(reqs)]
                out: list[list[RequestHandle]] = []
                try:
                    for req in reqs:  # the request's arrival ticket holds the wave meanwhile
                        out.append(engine.submit_n(req, n))
                except BaseException:
                    for h in (h for handles in out for h in handles):
                        h.cancel()
                    raise
                return out
            finally:
                if self.arrival is not None:
                    self.arrival.release()

        now = time.perf_counter()
        timeout = state.config.request_timeout
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        try:
            handles = await offload(submit)
        except Overloaded as e:
            wait = retry_after(engine.admission.drain_s())
            raise APIError(429, f"server busy: {e}", headers={"Retry-After": str(wait)}) from e
        except (KVBudgetExceeded, ValueError) as e:
            raise bad_request(str(e)) from e
        except RuntimeError as e:  # the engine is closing
            raise APIError(503, str(e), headers={"Retry-After": "5"}) from e
        for g, hs in zip(gens, handles, strict=True):
            g.handles, g.submitted_at = hs, now
            if deadline is not None:
                g.timeout, g.deadline = timeout, deadline

    def behind(self) -> bool:
        return any(g.behind() for g in self.gens)

    def cancel(self) -> None:
        for g in self.gens:
            g.cancel()

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every prompt's chunks as they arrive, renumbered; closing this closes them all."""

        async def renumbered(i: int, g: Generation) -> AsyncIterator[Chunk]:
            async for chunk in g.chunks():
                yield replace(chunk, index=i * self.n + chunk.index)

        streams = [renumbered(i, g) for i, g in enumerate(self.gens)]
        try:
            async with aclosing(interleave(streams)) as chunks:
                async for chunk in chunks:
                    yield chunk
            if self.arrival is not None:
                self.arrival.replied()  # its client may be back: a new wave may wait for it
        finally:
            if any(h.done is None for g in self.gens for h in g.handles):
                self.cancel()  # rows still running (a client gone, an error) are freed
