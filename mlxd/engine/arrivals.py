"""Requests a server has received and not yet submitted (their bodies being read, their
prompts rendered and tokenized), so that a new wave can wait for them.

An agent fleet's turns reach the server together, but each prompt takes a few ms of the GIL
to build, so they reach the engine over 0.1-0.5 s. Admitted as they come, 32 turns joined in
three waves (a serial row, then 11, then 20), each paying a whole join: a padded prefill and a
stall of the running rows (docs/performance.md §1, the join window). While requests are on
their way, a new wave waits for them, at most `window` seconds after its oldest request was
queued: one wave instead of three. A lone agent never waits (nothing else is on its way).

A fleet's turns can also reach the server apart: on a fast step the first few agents are
back while the others are still reading their last reply, so nothing is on its way for a
moment and 3-5 rows joined ahead of the other 27-29 (H200). Replies that ended
just before are turns likely to come back: a new wave also waits, within the same window,
while fewer requests came in than replies ended since the window's start.
"""

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Ticket:
    """One request on its way; released right after its submit (or when its handling fails)."""

    def __init__(self, arrivals: "Arrivals | None") -> None:
        self.came_at = time.perf_counter()  # the request reached the server (engine traces)
        self._arrivals = arrivals
        self._home = arrivals  # kept after release: the reply's end is counted there
        if arrivals is not None:
            arrivals.came()

    def replied(self) -> None:
        """The request's reply ended normally: its client may come back with a next turn."""
        if self._home is not None:
            self._home.replied()

    def release(self) -> None:
        a, self._arrivals = self._arrivals, None
        if a is not None:
            a.released()


class Arrivals:
    """One per server (every engine it serves reads it: a request's engine is known only after
    its body is read, and the wait must cover that part too)."""

    def __init__(self, window: float) -> None:
        if window < 0:
            raise ValueError("join window must be >= 0 seconds")
        self.window = window
        self.lock = threading.Lock()
        self.pending = 0  # tickets not yet released
        # perf_counter times of recent tickets and of recent replies' ends, in time order.
        self.comings: deque[float] = deque()
        self.ends: deque[float] = deque()
        # The engines' admission conditions (weakly: an unloaded model's engine goes).
        self.wakes: weakref.WeakSet[threading.Condition] = weakref.WeakSet()
        # Told each came / released / replied: engines in other processes mirror this one.
        self.listeners: list[Callable[[str], None]] = []

    def attach(self, wake: threading.Condition) -> None:
        self.wakes.add(wake)

    @contextmanager
    def coming(self) -> Iterator[Ticket]:
        """Around a request's body reading, prompt building and submit."""
        ticket = Ticket(self if self.window > 0 else None)
        try:
            yield ticket
        finally:
            ticket.release()

    def came(self) -> None:
        """A request reached the server (its ticket is taken)."""
        with self.lock:
            self.pending += 1
            self._note(self.comings)
        self._tell("came")

    def released(self) -> None:
        """A ticket was released (its request submitted, or its handling failed)."""
        with self.lock:
            self.pending -= 1
        for wake in list(self.wakes):  # an engine may be waiting for this one
            with wake:
                wake.notify()
        self._tell("released")

    def replied(self) -> None:
        """A reply ended normally (a turn that may come back)."""
        with self.lock:
            self._note(self.ends)
        self._tell("replied")

    def _tell(self, kind: str) -> None:
        for listener in self.listeners:
            listener(kind)

    def _note(self, times: deque[float]) -> None:
        now = time.perf_counter()
        times.append(now)
        for old in (self.comings, self.ends):  # hold() never looks past two windows back
            while old and old[0] < now - 2 * self.window:
                old.popleft()

    def maybe(self) -> bool:
        """Lock-free: hold() could be > 0 (something on its way, or a reply ended lately)."""
        return self.pending > 0 or bool(self.ends)

    def expected(self, oldest_queued: float) -> int:
        """Replies ended since the window before `oldest_queued` whose turns have not come."""
        with self.lock:
            ends = [t for t in self.ends if t >= oldest_queued - self.window]
            if not ends:
                return 0
            came = sum(1 for t in self.comings if t >= ends[0])
        return max(0, len(ends) - came)

    def hold(self, oldest_queued: float | None) -> float:
        """Seconds a new wave should still wait (0: admit now). `oldest_queued`: the
        perf_counter time the oldest waiting request was submitted (None: none waits)."""
        if oldest_queued is None:
            return 0.0
        left = oldest_queued + self.window - time.perf_counter()
        if left <= 0 or (self.pending <= 0 and self.expected(oldest_queued) <= 0):
            return 0.0
        return left
