"""A lone stream read on the main thread runs the engine's turns there, as mlx-lm's loop runs
on its caller's thread.

Handing every token from the engine thread to a reader costs a thread wake-up or a GIL hand-off
per token; on the H200's VMs that was 3-7% of a host-bound step and one graph build (~5 ms) of
TTFT (docs/performance.md). So when the engine is idle, the Python API's reader becomes its
driver: it runs the turns itself, under the turn lock, while its serial row is alone.

MLX streams and PRNG keys are per thread, so after each of its turns the driver leaves the row
ready for another thread: nothing lazy and its last drawn key at hand (SerialRow._schedule).
The engine thread takes the row at its next turn, whether the driver let go (it saw other work,
before or right after a turn) or just stopped asking (a paused generator). Only one thread runs
turns at a time, and a turn is the same code on either thread, so the bits are the same.
Only the main thread drives: MLX (0.32, CPU backend) can abort at exit after a thread that ran
MLX ops has ended, and the main thread ends last.
"""

import threading
from collections.abc import Callable, Iterator

from .admission import Admission
from .request import RequestHandle, TokenEvent
from .rows import Rows


class Driver:
    """The turn lock, the driving reader, and the engine thread's wait for work."""

    def __init__(self, queue: Admission, rows: Rows, turn: Callable[..., bool]) -> None:
        self.queue, self.rows, self._turn = queue, rows, turn
        self.lock = threading.Lock()  # held by whichever thread runs a turn
        self.handle: RequestHandle | None = None  # the driving reader's request
        self._driven: RequestHandle | None = None  # whose row a driver's turn left ready

    def claim(self, handle: RequestHandle, allowed: bool) -> None:
        """`handle` drives if the engine is idle and this is the main thread."""
        main = threading.current_thread() is threading.main_thread()
        with self.queue.wake:
            if main and allowed and self._idle():
                self.handle = handle

    def drive(self, handle: RequestHandle) -> Iterator[TokenEvent]:
        """The handle's token events; each one missing is made here by a turn while the row is
        alone, otherwise the engine thread makes them."""
        try:
            while handle.done is None:
                event = handle.poll()
                if event is not None:
                    yield event
                elif handle.done is None and not self.drive_once(handle):
                    yield from handle
        finally:  # a reader that stops early: the engine thread ends the row
            self.release(handle)

    def drive_once(self, handle: RequestHandle) -> bool:
        """One turn here if the row is still alone (False: the engine thread has it now)."""
        with self.lock:
            if self.handle is not handle or not self._still_alone(handle):
                self.release(handle)
                return False
            self._turn(only=handle)
            self._driven = handle  # its turn left nothing lazy (SerialRow._schedule)
            if not self._still_alone(handle):  # others came during the turn: let them in
                self.release(handle)
            return True

    def take_back(self) -> None:
        """The engine thread, under the turn lock, before its turn: a driven row is its own
        from here on, with the key the driver's thread last gave it (keys are per thread)."""
        rows = self.rows
        if self._driven is not None:
            if rows.serial is not None and rows.serial[1] is self._driven:
                row = rows.serial[0]
                rows.keys.take_over(row, row.key)
                rows.paths["driven->engine thread"] += 1
            self._driven = None
        self.handle = None

    def _still_alone(self, handle: RequestHandle) -> bool:
        rows = self.rows
        if not self.queue.waiting and not self.queue.closed:
            # The per-token fast path, without the lock: only turns (this thread's, under the
            # turn lock) change the rows; a request arriving just after this waits one turn.
            if not rows.batches and not rows.forks:
                return rows.serial is None or rows.serial[1] is handle
        with self.queue.wake:
            return self._alone_with(handle) and not rows.batches and not rows.forks

    def _idle(self) -> bool:
        return (
            self.handle is None
            and not self.queue.closed
            and not self.queue.waiting
            and not self.rows.active()
        )

    def _alone_with(self, handle: RequestHandle) -> bool:
        """Nothing but `handle`'s row is running or waiting (holding the queue's lock)."""
        if self.queue.closed:
            return False
        waiting = all(h is handle for _, h in self.queue.waiting)
        return waiting and all(h is handle for h in self.rows.active())

    def release(self, handle: RequestHandle) -> None:
        """`handle` stops driving: the engine thread serves what is left of its row."""
        with self.queue.wake:
            if self.handle is handle:
                self.handle = None
                self.queue.wake.notify()

    def has_work(self) -> bool:
        """Work for the engine thread (holding the queue's lock): a driver's own row is not."""
        if self.queue.closed:
            return True
        if self.handle is None:
            return bool(self.queue.waiting) or bool(self.rows.active())
        return any(h is not self.handle for _, h in self.queue.waiting)

    def await_turn(self, hold: Callable[[], float], idle: Callable[[], None]) -> None:
        """The engine thread's wait between turns: none while it has rows of its own.
        `hold`: the join window's wait for requests on their way (scheduler.py)."""
        if self.handle is None and self.rows.busy():
            return  # the per-token fast path: no lock
        idle()
        with self.queue.wake:
            while True:
                if not self.has_work():
                    self.queue.wake.wait()
                elif (wait := hold()) > 0:  # a wave waits for requests on their way
                    self.queue.wake.wait(wait)
                else:
                    return
