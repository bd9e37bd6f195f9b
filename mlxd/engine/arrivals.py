"""Requests a server has received and not yet submitted (their bodies being read, their
prompts rendered and tokenized), so that a new wave can wait for them.

An agent fleet's turns reach the server together, but each prompt takes a few ms of the GIL
to build, so they reach the engine over 0.1-0.5 s. Admitted as they come, 32 turns joined in
three waves (a serial row, then 11, then 20), each paying a whole join: a padded prefill and a
stall of the running rows (docs/performance.md §1, the join window). While requests are on
their way, a new wave waits for them, at most `window` seconds after its oldest request was
queued: one wave instead of three. A lone agent never waits (nothing else is on its way).
"""

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager


class Ticket:
    """One request on its way; released right after its submit (or when its handling fails)."""

    def __init__(self, arrivals: "Arrivals | None") -> None:
        self._arrivals = arrivals
        if arrivals is not None:
            with arrivals.lock:
                arrivals.pending += 1

    def release(self) -> None:
        a, self._arrivals = self._arrivals, None
        if a is not None:
            with a.lock:
                a.pending -= 1
            for wake in list(a.wakes):  # an engine may be waiting for this one
                with wake:
                    wake.notify()


class Arrivals:
    """One per server (every engine it serves reads it: a request's engine is known only after
    its body is read, and the wait must cover that part too)."""

    def __init__(self, window: float) -> None:
        if window < 0:
            raise ValueError("join window must be >= 0 seconds")
        self.window = window
        self.lock = threading.Lock()
        self.pending = 0  # tickets not yet released
        # The engines' admission conditions (weakly: an unloaded model's engine goes).
        self.wakes: weakref.WeakSet[threading.Condition] = weakref.WeakSet()

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

    def hold(self, oldest_queued: float | None) -> float:
        """Seconds a new wave should still wait (0: admit now). `oldest_queued`: the
        perf_counter time the oldest waiting request was submitted (None: none waits)."""
        if oldest_queued is None or self.pending <= 0:
            return 0.0
        return max(0.0, oldest_queued + self.window - time.perf_counter())
