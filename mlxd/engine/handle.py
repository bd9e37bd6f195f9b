"""The caller's side of a submitted request: a stream of events, usable from threads or asyncio."""

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator

from .request import DoneEvent, TokenEvent

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

    def __init__(self) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()
        self.done: DoneEvent | None = None
        self.submitted = time.perf_counter()
        self.arrived: float | None = None  # when its request reached the server (a Ticket's)
        self.cached_tokens = 0  # prompt tokens the prefix store served (set at admission)

    # engine side
    def put(self, event: Event) -> None:
        self._events.put(event)
        if watchers := self._watching():
            wake(watchers)

    def put_quiet(self, event: Event) -> Watchers:
        """Queue `event` without waking anyone; the caller passes the result to `wake` (one
        wake-up per event loop for a whole batched step, not one per row)."""
        self._events.put(event)
        return self._watching()

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
