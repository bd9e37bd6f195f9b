"""Admission: the bounded FIFO of waiting requests, the row cap, and the KV budget (a row's
worst-case KV cost, probed per model)."""

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..config import EngineConfig
from ..kv import mixed
from .batch_row import batchable
from .drain import DrainRate
from .request import DoneEvent, GenerationRequest, RequestHandle

Waiting = tuple[GenerationRequest, RequestHandle]


class Overloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class Admission:
    def __init__(
        self,
        cap: int,
        max_queue: int,
        kv_budget: int | None,
        model: Any,
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap, self.max_queue, self.kv_budget, self.config = cap, max_queue, kv_budget, config
        # The running rows' handles (the scheduler hands its Rows.active over; read under the
        # lock): rows free now are not queue places, whatever holds a wave back.
        self.running: Callable[[], list[RequestHandle]] = list
        self.rate = DrainRate(clock)  # when requests got rows lately (Retry-After)
        self.kv_cost = KVCost.probe(model) if kv_budget is not None else None
        self.waiting: collections.deque[Waiting] = collections.deque()
        self.wake = threading.Condition()
        self.closed = False
        self._need: dict[int, int] = {}  # id(handle) -> reserved worst-case KV bytes

    def check(self, req: GenerationRequest) -> None:
        """Refuse, in the caller, a request that could never fit the KV budget."""
        if self.kv_cost is None:
            return
        need = self.kv_cost.worst(req) * req.n
        if need > self.kv_budget:
            raise KVBudgetExceeded(
                f"request needs {need} bytes of KV cache (prompt {len(req.prompt)} + "
                f"max_tokens {req.max_tokens} tokens) but kv_budget is {self.kv_budget} bytes"
            )

    def push(self, items: list[Waiting]) -> None:
        with self.wake:
            if self.closed:
                raise RuntimeError("engine is closed")
            if self._beyond_rows(items) > self.max_queue:
                raise Overloaded(f"{len(self.waiting)} requests waiting (max_queue)")
            self.waiting.extend(items)
            self.wake.notify()

    def _beyond_rows(self, items: list[Waiting]) -> int:
        """Waiting requests, `items` last, that the free rows cannot take in FIFO order: the
        queue max_queue bounds. A burst's first wave sits here while the join window holds it
        (arrivals.py), though its rows are free."""
        free = self.cap - self._rows_running()
        beyond = 0
        for req, _ in itertools.chain(self.waiting, items):
            if beyond == 0 and req.n <= free:
                free -= req.n
            else:
                beyond += 1
        return beyond

    def _rows_running(self) -> int:
        for _ in range(3):
            try:
                return len(self.running())
            except RuntimeError:  # the engine thread changed its rows mid-read: read again
                continue
        return self.cap  # unknown: no row counts as free

    def drain_s(self) -> float | None:
        """Seconds until every waiting request has a row at the recent rate (None: nobody
        waits; inf: no request got a row lately)."""
        with self.wake:
            waiting = sum(req.n for req, _ in self.waiting)
            return self.rate.seconds_for(waiting) if waiting else None

    def _fits(self, req: GenerationRequest, handle: RequestHandle, live: set[int]) -> bool:
        """Reserve the row's worst case if it fits beside the live rows."""
        if self.kv_cost is None:
            return True
        self._need = {k: v for k, v in self._need.items() if k in live}
        need = self.kv_cost.worst(req) * req.n
        if sum(self._need.values()) + need > self.kv_budget:
            return False
        self._need[id(handle)] = need
        return True

    def push_front(self, items: list[Waiting]) -> None:
        """Requests the engine took but sends back to wait (ahead of later arrivals)."""
        with self.wake:
            self.waiting.extendleft(reversed(items))

    def take(
        self,
        active: Callable[[], list[RequestHandle]],
        alone: bool,
        defer: Callable[[GenerationRequest], bool] | None = None,
        only: RequestHandle | None = None,
    ) -> list[Waiting]:
        """FIFO joiners for this turn (the engine waits for work before it asks: driver.py). A
        request that cannot be batched is taken only when nothing else runs, and then alone.
        One that `defer` holds back keeps its place while later ones go ahead. `only`: a
        driver's turn takes its own request and no other (driver.py)."""
        if not self.waiting or self.closed:
            return []  # the per-token fast path: no lock, nothing to admit
        with self.wake:
            if only is not None:
                live = {id(h) for h in active()}
                mine = [w for w in self.waiting if w[1] is only and self._fits(*w, live)]
                for w in mine:
                    self.waiting.remove(w)
                self.rate.admitted(sum(req.n for req, _ in mine))
                return mine
            running = active()
            live = {id(h) for h in running}
            joiners: list[Waiting] = []
            i = 0
            while i < len(self.waiting) and not alone:
                req, handle = self.waiting[i]
                if handle.cancelled and req.n == 1:  # a group's siblings end in the engine
                    del self.waiting[i]
                    handle.put(DoneEvent("cancelled"))
                    continue
                if defer is not None and defer(req):
                    i += 1
                    continue
                if len(running) + sum(r.n for r, _ in joiners) + req.n > self.cap:
                    break
                solo = batchable(req, self.config) is not None
                if solo and (running or joiners):
                    break  # it waits until it can run alone
                if not self._fits(req, handle, live | {id(h) for _, h in joiners}):
                    break  # it waits until enough KV is free
                joiners.append(self.waiting[i])
                del self.waiting[i]
                alone = solo
            self.rate.admitted(sum(req.n for req, _ in joiners))
            return joiners

    def reserved(self, live: set[int]) -> int:
        return sum(v for k, v in self._need.items() if k in live)

    def close(self) -> None:
        with self.wake:
            self.closed = True
            self.wake.notify()

    def drain(self) -> list[RequestHandle]:
        """The handles still waiting, removed (the engine cancels them at shutdown)."""
        with self.wake:
            handles = [h for _, h in self.waiting]
            self.waiting.clear()
            return handles


# KV budget admission: a row is admitted only when its worst-case KV fits beside the rows already
# running (prompt + max_tokens, every layer at its own growth rule).


class KVBudgetExceeded(ValueError):
    """The request can never fit the engine's kv_budget."""


def _state_bytes(cache: Any) -> int:
    return sum(a.nbytes for _, a in tree_flatten(cache.state) if isinstance(a, mx.array))


def _token_bytes(cache: Any) -> int:
    """Bytes per token of a KV layer (keys and values are [B, heads, tokens, dim])."""
    return sum(a.nbytes // a.shape[-2] for a in (cache.keys, cache.values))


def _converts_at(req: GenerationRequest) -> int:
    """The offset at which generate_step converts a row's caches: the first model call that
    reaches `quantized_kv_start` (a prefill chunk's end, or a decode step)."""
    start, prefill = req.quantized_kv_start, len(req.prompt) - 1
    if start > prefill:
        return start
    chunk = req.prefill_step_size
    return min(max(-(-start // chunk), 1) * chunk, prefill)


def _allocated(tokens: int, step: int) -> int:
    """KV caches grow in steps of `step` tokens: memory follows the rounded-up length."""
    return -(-tokens // step) * step


@dataclass
class KVCost:
    """Bytes of one row's caches as a function of its length."""

    per_token: int = 0  # growing layers (full attention)
    windowed: list[tuple[int, int]] = field(default_factory=list)  # (bytes/token, window)
    fixed: int = 0  # recurrent state, whatever the length
    context: int | None = None  # the model's maximum positions, if it says
    itemsize: int = 2  # bytes of one key / value element (the model's dtype)
    per_layer: list[int] = field(default_factory=list)  # growing bytes/token by layer (0: other)

    @classmethod
    def probe(cls, model: Any) -> "KVCost":
        """Measure by running one token through a fresh cache (exact for the model's dtypes)."""
        cache = make_prompt_cache(model)
        model(mx.array([[0]]), cache=cache)
        cost = cls(context=getattr(getattr(model, "args", None), "max_position_embeddings", None))
        for c in cache:
            mx.eval(c.state)
            cost.per_layer.append(0)
            if isinstance(c, RotatingKVCache):
                cost.windowed.append((_token_bytes(c), c.max_size))
            elif isinstance(c, KVCache):
                cost.per_layer[-1] = _token_bytes(c)
                cost.per_token += _token_bytes(c)
                cost.itemsize = c.keys.itemsize
            else:
                cost.fixed += _state_bytes(c)
        return cost

    def token_bytes(self, kv_bits: int | None = None, group_size: int = 64) -> float:
        """Bytes one token adds to the growing (full-attention) layers under a KV scheme:
        `bits` per element packed, plus a scale and a bias per group in the model's dtype."""
        if kv_bits is None:
            return float(self.per_token)
        per_element = kv_bits / 8 + 2 * self.itemsize / group_size
        return self.per_token * per_element / self.itemsize

    def row_token_bytes(self, req: GenerationRequest) -> float:
        """Bytes per token of the row's growing layers once its KV scheme applies."""
        if req.kv_config is not None:
            return mixed.token_bytes(req.kv_config, self.per_layer, self.itemsize)
        return self.token_bytes(req.kv_bits, req.kv_group_size)

    def worst(self, req: GenerationRequest) -> int:
        """Worst-case bytes of `req` over its whole life."""
        gen = req.max_tokens if req.max_tokens >= 0 else self.context
        if gen is None:
            raise KVBudgetExceeded(
                "max_tokens=-1 (no limit) has no worst case under kv_budget; set max_tokens"
            )
        # a verify step writes a row's drafts before cutting the rejected ones back
        spec = req.speculation
        drafts = spec.max_draft if spec is not None else 0
        tokens = len(req.prompt) + gen + drafts
        if req.max_kv_size is not None:
            tokens = min(tokens, req.max_kv_size)
        step = KVCache.step
        growing = _allocated(tokens, step) * self.token_bytes()
        quantizes = req.kv_bits is not None or req.kv_config is not None
        if quantizes and tokens - 1 >= req.quantized_kv_start:
            # Unquantized until its conversion, then quantized (the moment both copies exist is
            # one row at a time on the engine thread: not reserved per row).
            quant = _allocated(tokens, step) * self.row_token_bytes(req)
            at = _allocated(_converts_at(req), step) * self.token_bytes()
            growing = max(at, quant)
        # A window holds up to max_size tokens, but a prefill chunk is appended whole first.
        chunk = min(tokens, req.prefill_step_size)
        windowed = sum(
            b * max(min(_allocated(tokens, step), w), min(tokens, w - 1 + chunk))
            for b, w in self.windowed
        )
        return int(growing + windowed + self.fixed)
