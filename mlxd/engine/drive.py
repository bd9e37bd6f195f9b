"""A lone stream read on the main thread runs the engine's turns there, as mlx-lm's loop runs
on its caller's thread.

Handing every token from the engine thread to a reader costs a thread wake-up or a GIL hand-off
per token; on the H200's VMs that was 3-7% of a host-bound step and one graph build (~5 ms) of
TTFT (docs/performance.md §4 item 8). So when the engine is idle, the Python API's reader becomes
its driver: it runs the turns itself, under the turn lock, while its serial row is alone.

MLX streams and PRNG keys are per thread, so a row made on one thread must be left ready for
another. When the driver sees other work, before its next turn or right after one, it hands
the row over itself (its arrays evaluated, its key read into the engine's `KeyOwner`). And
after each of its turns it schedules what the row holds and pins the row's key, so the engine
thread can also take the row between turns when a reader stops asking (a paused generator).
Only one thread runs turns at a time, and a turn is the same code on
either thread, so the bits are the same. Only the main thread drives: MLX (0.32, CPU backend)
can abort at exit after a thread that ran MLX ops has ended, and the main thread ends last.
"""

import threading
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from .handle import RequestHandle
from .materialize import materialize
from .request import GenerationRequest, TokenEvent


class Driving:
    """Mixed into Engine: the turn lock, the driver, and the engine thread's wait for work."""

    admission: Any
    serial_fast_path: bool
    _serial: Any
    _batches: dict[Any, Any]
    _forks: list[Any]
    _keys: Any
    paths: Any
    _active: Callable[[], list[RequestHandle]]
    _busy: Callable[[], bool]
    _submit: Callable[[list[GenerationRequest], list[RequestHandle]], list[RequestHandle]]
    _turn: Callable[..., bool]
    drivable = True  # False: every reader waits for the engine thread (the A/B's other side)

    def _init_driving(self) -> None:
        self._turn_lock = threading.Lock()  # held by whichever thread runs a turn
        self._driver: RequestHandle | None = None

    def submit_driven(self, req: GenerationRequest) -> RequestHandle:
        """Submit `req`; read it with `drive`. If the engine is idle and this is the main
        thread, this thread will run the turns while its row is alone."""
        handle = RequestHandle()
        main = threading.current_thread() is threading.main_thread()
        with self.admission.wake:
            if main and self.drivable and self.serial_fast_path and self._idle():
                self._driver = handle
        try:
            self._submit([req], [handle])
        except BaseException:
            self._release(handle)
            raise
        if self._driver is handle:
            with self._turn_lock:  # paths is counted under the turn lock (by turns)
                self.paths["driven"] += 1
        return handle

    def drive(self, handle: RequestHandle) -> Iterator[TokenEvent]:
        """The handle's token events; each one missing is made here by a turn while the row is
        alone, otherwise the engine thread makes them."""
        try:
            while handle.done is None:
                event = handle.poll()
                if event is not None:
                    yield event
                elif handle.done is None and not self._drive_once(handle):
                    yield from handle
        finally:  # a reader that stops early: the engine thread ends the row
            if self._driver is handle and threading.current_thread() is threading.main_thread():
                with self._turn_lock:
                    self._hand_over(handle)
            self._release(handle)

    def _drive_once(self, handle: RequestHandle) -> bool:
        """One turn here if the row is still alone; else hand it over (False)."""
        with self._turn_lock:
            if self._driver is not handle:
                return False
            if not self._still_alone(handle):
                self._hand_over(handle)
                return False
            self._turn(only=handle)
            if not self._still_alone(handle):  # others came during the turn: don't keep them
                self._hand_over(handle)
            else:
                self._leave_ready()
            return True

    def _leave_ready(self) -> None:
        """After a driven turn: schedule what the row holds and pin its key, so the engine
        thread can take the row between turns even if this reader never comes back."""
        pending = self._keys.pin()
        if self._serial is not None:
            row = self._serial[0]
            pending += [a for a in (row.prompt, row.emb, row.tokens) if a is not None]
        mx.async_eval(pending)

    def _take_back(self) -> None:
        """The engine thread, under the turn lock, with work beside a driver's row: the row is
        its own from this turn on (the driver notices before its next turn)."""
        if self._driver is not None:
            self._keys.take_pinned()
            self._driver = None
            self.paths["driven->engine thread"] += 1

    def _still_alone(self, handle: RequestHandle) -> bool:
        with self.admission.wake:
            return self._alone_with(handle) and not self._batches and not self._forks

    def _hand_over(self, handle: RequestHandle) -> None:
        """On the driver's thread, under the turn lock: nothing lazy left in the row, its key
        with the KeyOwner, then the engine thread takes the row as it is."""
        if self._serial is not None:
            row = self._serial[0]
            materialize(row.cache, row.prompt, row.emb, row.tokens, row.y, row.logprobs, row.read)
            self.paths["driven->engine thread"] += 1
        self._keys.spill()
        self._release(handle)

    def _idle(self) -> bool:
        return (
            self._driver is None
            and not self.admission.closed
            and not self.admission.waiting
            and not self._active()
        )

    def _alone_with(self, handle: RequestHandle) -> bool:
        """Nothing but `handle`'s row is running or waiting (holding admission.wake)."""
        if self.admission.closed:
            return False
        waiting = all(h is handle for _, h in self.admission.waiting)
        return waiting and all(h is handle for h in self._active())

    def _release(self, handle: RequestHandle) -> None:
        """`handle` stops driving: the engine thread serves what is left of its row."""
        with self.admission.wake:
            if self._driver is handle:
                self._driver = None
                self.admission.wake.notify()

    def _has_work(self) -> bool:
        """Work for the engine thread (holding admission.wake): a driver's own row is not."""
        if self.admission.closed:
            return True
        if self._driver is None:
            return bool(self.admission.waiting) or bool(self._active())
        return any(h is not self._driver for _, h in self.admission.waiting)

    def _await_turn(self) -> None:
        """The engine thread's wait between turns: none while it has rows of its own."""
        if self._driver is None and self._busy():
            return  # the per-token fast path: no lock
        with self.admission.wake:
            while not self._has_work():
                self.admission.wake.wait()
