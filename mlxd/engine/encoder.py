"""The batched step encoded on a thread of its own (`--step-order thread`).

At 32 rows on a small model the step is host-bound: MLX-CUDA's encode (`mx.async_eval`, ~11 µs
a kernel) took 6.7 ms of a 0.6B step and its Python build 1.8 ms more, one after the other on
the engine thread (docs/performance.md, session 43). The encode releases the GIL, so here a
second thread encodes step n+1 while the engine thread emits step n's tokens and builds step
n+2: the host's part of a step becomes the longer of the two, not their sum. Each step holds the
rows it holds in mlx-lm's pipelined order, and the graph is the same: the same bits.

MLX keeps a stream's command encoder per thread; a thread-unsafe stream's is global, so both
threads may encode on it, one at a time. The encoder runs one job at a time, and the engine
thread calls `settle()` before anything of its own evaluates (joins, leaves, the store, and the
prefill chunk mlx-lm's `next()` runs right after the step: `settle_after`, batch_logits.py).
The thread is a pooled one (threads.py) that outlives the batch: a thread that ran MLX work
and ended takes its thread-local streams and command encoders down with it.
"""

import threading
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .threads import run_on_worker

NAME = "mlxd-step-encoder"  # the pooled thread's name while it encodes
_stream: Any = None


def stream() -> Any:
    """The process's stream for batches encoded by a StepEncoder (made once: MLX keeps every
    stream it makes)."""
    global _stream
    if _stream is None:
        _stream = mx.new_thread_unsafe_stream(mx.default_device())
    return _stream


class StepEncoder:
    """One thread that, per job, queues the next step's first layers, reads the last step's
    tokens, hands them over, then queues the rest of the next step."""

    def __init__(self, clock: Any = None) -> None:
        self.clock = clock  # a StepClock: this thread's parts as `enc ...` (step_clock.py)
        self._cv = threading.Condition()
        self._job: tuple[Any, ...] | None = None  # (first, read, tokens, queue)
        self._tokens: list[int] | None = None
        self._error: BaseException | None = None  # the job's read failed: its step's error
        self._late: BaseException | None = None  # the job's encode failed: the next call's
        self._busy = False  # a job not yet encoded
        self._closed = False
        self._ended = threading.Event()  # its loop returned: the thread is back in the pool
        self._thread = run_on_worker(self._serve, self._ended)

    def step(
        self,
        read: Sequence[mx.array],
        tokens: mx.array,
        queue: Sequence[mx.array],
        first: Sequence[mx.array] = (),
    ) -> list:
        """`tokens` as a list once `read` (which holds them) is computed; `queue` is encoded
        after, while the caller goes on. `first` (the next step's first layers) is queued before
        the read, so the device has work while the rest is encoded (step_order.py's split)."""
        with self._cv:
            self._settled()
            job = (first, read, tokens, queue)
            self._job, self._tokens, self._error, self._busy = job, None, None, True
            self._cv.notify_all()
            while self._tokens is None and self._error is None:
                self._cv.wait()
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            out, self._tokens = self._tokens, None
            return out

    def settle(self) -> None:
        """Wait until the last job's step is encoded (its error, if any, raised here)."""
        with self._cv:
            self._settled()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._ended.wait()

    def _serve(self) -> None:
        me = threading.current_thread()
        pooled, me.name = me.name, NAME
        try:
            self._run()
        finally:
            me.name = pooled

    def _settled(self) -> None:
        while self._busy:
            self._cv.wait()
        if self._late is not None:
            error, self._late = self._late, None
            raise error

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                (first, read, tokens, queue), self._job = self._job, None
            clock = self.clock
            if clock is not None:
                clock.begin()
            try:
                if first:
                    mx.async_eval(*first)
                    _mark(clock, "enc first")
                mx.eval(*read)
                _mark(clock, "enc read")
                out = tokens.tolist()
            except BaseException as e:  # noqa: BLE001 - anything: the engine must not wait forever
                # the engine thread raises it and ends the rows
                with self._cv:
                    self._error, self._busy = e, False
                    self._cv.notify_all()
                continue
            with self._cv:
                self._tokens = out
                self._cv.notify_all()
            _mark(clock, "enc hand")
            try:
                mx.async_eval(*queue)
                _mark(clock, "enc rest")
            except BaseException as e:  # noqa: BLE001 - as above; raised at the next call
                with self._cv:
                    self._late = e
            with self._cv:
                self._busy = False
                self._cv.notify_all()


def _mark(clock: Any, part: str) -> None:
    """Each part's time includes taking the GIL back after MLX released it."""
    if clock is not None:
        clock.mark(part)
