"""A lone stream read on the main thread runs the engine's turns there, as mlx-lm's loop runs
on its caller's thread.

Handing every token from the engine thread to a reader costs a thread wake-up or a GIL hand-off
per token; on the H200's VMs that was 3-7% of a host-bound step and one graph build (~5 ms) of
TTFT (docs/performance.md §4 item 8). So when the engine is idle, the Python API's reader becomes
its driver: it runs the turns itself, under the turn lock, while its serial row is alone.

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
from typing import Any

from .handle import RequestHandle
from .request import GenerationRequest, TokenEvent


class Driving:
    """Mixed into Engine: the turn lock, the driver, and the engine thread's wait for work
    (with the join window's hold for requests on their way, arrivals.py)."""

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
    sharing: Any
    arrivals: Any
    drivable = True  # False: every reader waits for the engine thread (the A/B's other side)

    def _init_driving(self) -> None:
        self._turn_lock = threading.Lock()  # held by whichever thread runs a turn
        self._driver: RequestHandle | None = None
        self._driven: RequestHandle | None = None  # whose row a driver's turn left ready
        self._held_for: float | None = None  # the oldest waiting request of the last hold
        self._lead_seen: tuple[float, int, bool] = (0.0, -1, False)  # _leads' last answer

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
            self._release(handle)

    def _drive_once(self, handle: RequestHandle) -> bool:
        """One turn here if the row is still alone (False: the engine thread has it now)."""
        with self._turn_lock:
            if self._driver is not handle or not self._still_alone(handle):
                self._release(handle)
                return False
            self._turn(only=handle)
            self._driven = handle  # its turn left nothing lazy (SerialRow._schedule)
            if not self._still_alone(handle):  # others came during the turn: let them in
                self._release(handle)
            return True

    def _take_back(self) -> None:
        """The engine thread, under the turn lock, before its turn: a driven row is its own
        from here on, with the key the driver's thread last gave it (keys are per thread)."""
        if self._driven is not None:
            if self._serial is not None and self._serial[1] is self._driven:
                row = self._serial[0]
                self._keys.take_over(row, row.key)
                self.paths["driven->engine thread"] += 1
            self._driven = None
        self._driver = None

    def _still_alone(self, handle: RequestHandle) -> bool:
        if not self.admission.waiting and not self.admission.closed:
            # The per-token fast path, without the lock: only turns (this thread's, under the
            # turn lock) change the rows; a request arriving just after this waits one turn.
            if not self._batches and not self._forks:
                return self._serial is None or self._serial[1] is handle
        with self.admission.wake:
            return self._alone_with(handle) and not self._batches and not self._forks

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
        self._trace.idle()
        with self.admission.wake:
            while True:
                if not self._has_work():
                    self.admission.wake.wait()
                elif (wait := self._hold()) > 0:  # a wave waits for requests on their way
                    self.admission.wake.wait(wait)
                else:
                    return

    def _hold(self) -> float:
        """Seconds the next wave still waits for requests on their way (0: admit now); on
        the engine thread (a driver's turn admits only its own request)."""
        if not self.admission.waiting or not self.arrivals.maybe():
            return 0.0  # the per-turn fast path: no lock
        with self.admission.wake:
            first = self.admission.waiting[0] if self.admission.waiting else None
        oldest = first[1].submitted if first is not None else None
        wait = self.arrivals.hold(oldest)
        if wait > 0 and first is not None and self._leads(first[0], oldest):
            if oldest != self._held_for:
                self._held_for = oldest
                self.paths["started ahead of its wave"] += 1
            return 0.0
        if wait > 0 and oldest != self._held_for:  # a new wave held: counted once
            self._held_for = oldest
            self.paths["wave held for arrivals"] += 1
        return wait

    def _leads(self, req: GenerationRequest, submitted: float) -> bool:
        """Nothing runs and the oldest request has a prefill step or more the store lacks, up
        to a boundary it snapshots (a fleet's new system prompt, `PrefixSharing.leads`): it
        starts now, alone, while its wave's other turns are still on their way. Those that
        share its prompt wait for its snapshot anyway, and its prefill would otherwise start
        only after the last of them was tokenized."""
        if not self.arrivals.lead or self._busy() or self.sharing is None or req.n != 1:
            return False
        key = (submitted, self.sharing.store.version)  # a held wave asks at every arrival
        if self._lead_seen[:2] != key:
            self._lead_seen = (*key, self.sharing.leads(req))
        return self._lead_seen[2]
