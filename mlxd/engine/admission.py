"""Admission: the bounded FIFO of waiting requests, the row cap, and the KV budget."""

import collections
import threading
from collections.abc import Callable
from typing import Any

from .batch_row import BatchConfig, batchable
from .handle import RequestHandle
from .kv_budget import KVBudgetExceeded, KVCost
from .request import DoneEvent, GenerationRequest

Waiting = tuple[GenerationRequest, RequestHandle]


class Overloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class Admission:
    def __init__(
        self, cap: int, max_queue: int, kv_budget: int | None, model: Any, config: BatchConfig
    ) -> None:
        self.cap, self.max_queue, self.kv_budget, self.config = cap, max_queue, kv_budget, config
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
            if len(self.waiting) + len(items) > self.max_queue:
                raise Overloaded(f"{len(self.waiting)} requests waiting (max_queue)")
            self.waiting.extend(items)
            self.wake.notify()

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
        """FIFO joiners for this turn (the engine waits for work before it asks: drive.py). A
        request that cannot be batched is taken only when nothing else runs, and then alone.
        One that `defer` holds back keeps its place while later ones go ahead. `only`: a
        driver's turn takes its own request and no other (drive.py)."""
        if not self.waiting or self.closed:
            return []  # the per-token fast path: no lock, nothing to admit
        with self.wake:
            if only is not None:
                live = {id(h) for h in active()}
                mine = [w for w in self.waiting if w[1] is only and self._fits(*w, live)]
                for w in mine:
                    self.waiting.remove(w)
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
