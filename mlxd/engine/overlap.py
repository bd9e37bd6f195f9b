"""How the engine thread overlaps the host with the device: the step order, the thread that
queues big batches' steps, the GIL's switch interval by step phase, and the worker threads.

When a batched decode step is queued against the last one (`--step-order`):

- `pipelined` (mlx-lm's, the default off CUDA): step n+1 is queued, then step n's tokens read.
- `thread` (the default on CUDA): a thread of its own (StepEncoder, below) queues step n+1's first
  layers, reads step n's tokens, then queues the rest while the engine thread emits them and
  builds step n+2. MLX writes a KV slot in place only if no queued kernel still holds the
  layer's buffer; by the read, step n is past its first layers, so their writes are in place.
The graph is the same in either order: the same bits. On an H100 at 32 agents the thread order
decoded 1.06-1.08x faster than pipelined (docs/performance.md)."""

import logging
import math
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .request import Watchers, wake

FIRST_LAYERS = 0.33  # the share of layers queued before the read: the fraction the order won with


def default_order() -> str:
    """`thread` on CUDA, mlx-lm's `pipelined` elsewhere (Metal and the CPU are not measured).
    Asks MLX for CUDA: call it after `--cuda-graphs` is applied."""
    return "thread" if mx.cuda.is_available() else "pipelined"


def first_layers(caches: list[Any], fraction: float) -> list[mx.array]:
    """The KV buffers the first `fraction` of the layers write this step: queuing them queues
    those layers' whole work (and the next layer's projections up to its write)."""
    n = min(len(caches), max(1, math.ceil(len(caches) * fraction)))
    arrays = (getattr(c, name, None) for c in caches[:n] for name in ("keys", "values"))
    return [a for a in arrays if isinstance(a, mx.array)]


# The batched step encoded on a thread of its own (`--step-order thread`).
#
# At 32 rows on a small model the step is host-bound: MLX-CUDA's encode (`mx.async_eval`, ~11 µs a
# kernel) took 6.7 ms of a 0.6B step and its Python build 1.8 ms more, one after the other on the
# engine thread (docs/performance.md). The encode releases the GIL, so here a second thread
# encodes step n+1 while the engine thread emits step n's tokens and builds step n+2: the host's
# part of a step becomes the longer of the two, not their sum. Each step holds the rows it holds
# in mlx-lm's pipelined order, and the graph is the same: the same bits.
#
# MLX keeps a stream's command encoder per thread; a thread-unsafe stream's is global, so both
# threads may encode on it, one at a time. The encoder runs one job at a time, and the engine
# thread calls `settle()` before anything of its own evaluates (joins, leaves, the store, and the
# prefill chunk mlx-lm's `next()` runs right after the step: `settle_after`, decode_step.py). The
# thread is a pooled one (overlap.py) that outlives the batch: a thread that ran MLX work and
# ended takes its thread-local streams and command encoders down with it.

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
        self.clock = clock  # a StepClock: this thread's parts as `enc ...` (kernel_window.py)
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
        the read, so the device has work while the rest is encoded (overlap.py's split)."""
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


# The engine thread first at the GIL (opt-in: `--switch-interval engine`).
#
# The HTTP loop writes each row's chunk while the engine thread builds and runs the next step.
# Python makes a thread that waits for the GIL wait one switch interval (5 ms) before it may force
# the holder off. So the engine, back from a device wait, can wait up to 5 ms for the loop, and
# the loop, woken by the step's tokens, preempts the engine's graph build after one interval. Here
# the interval is long while the engine builds a step (the loop writes during the step's device
# waits instead) and short around those waits (the engine takes the GIL back quickly). A lone
# serial row keeps the short interval throughout: the loop has one frame a token to write. The
# readers of a batched step's tokens are woken when the next step is queued, not when the tokens
# are read (`HeldWake`): their frames are then written while the engine waits inside
# `mx.async_eval` / `mx.eval` (which release the GIL), not between its turns, where the engine
# builds the next step (a fleet step's build took 4.2 ms against 1.8 ms alone).


class HeldWake:
    """Readers' wake-ups held from one batched step's events until the next step is queued."""

    def __init__(self) -> None:
        self._watchers: Watchers = []

    def hold(self, watchers: Watchers) -> None:
        self.release()  # still held: the step since took mlx-lm's own path (no release there)
        self._watchers = watchers

    def release(self) -> None:
        if self._watchers:
            watchers, self._watchers = self._watchers, []
            wake(watchers)


WAIT_S = 0.0002  # the interval around a step's device waits


@dataclass(frozen=True)
class StepPhases:
    build_s: float  # while the step's graph is built: how long a waiting thread waits
    wait_s: float = WAIT_S  # from the step's async_eval on
    held: HeldWake = field(default_factory=HeldWake, compare=False)  # the last step's readers

    def building(self) -> None:
        sys.setswitchinterval(self.build_s)

    def waiting(self) -> None:
        """The step is built and about to be queued: the short interval, the readers woken."""
        sys.setswitchinterval(self.wait_s)
        self.held.release()


def step_phases(enabled: bool) -> StepPhases | None:
    """`--switch-interval engine`: phases around Python's interval as it is now; else None."""
    return StepPhases(sys.getswitchinterval()) if enabled else None


# Worker threads for MLX work that never exit.
#
# MLX (0.32, CPU backend) can abort the process at exit ("terminate called without an active
# exception") when a thread that ran MLX ops has finished; threads that are still alive are safe.
# So an engine's loop runs on a pooled daemon thread that goes back to the pool when it ends.

_idle: "queue.SimpleQueue[_Worker]" = queue.SimpleQueue()
log = logging.getLogger("mlxd.engine")


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="mlxd-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 - a worker must outlive its job (see above)
                log.exception("an mlxd worker job failed")
            finally:
                _idle.put(self)


def run_on_worker(job: Callable[[], None], done: threading.Event) -> threading.Thread:
    """Run `job` on an idle pooled thread (or a new one); `done` is set when it returns."""
    try:
        worker = _idle.get_nowait()
    except queue.Empty:
        worker = _Worker()

    def wrapped() -> None:
        try:
            job()
        finally:
            done.set()

    worker.jobs.put(wrapped)
    return worker.thread


def run_soon(job: Callable[[], None]) -> None:
    """Run `job` on an idle pooled thread (or a new one), without waiting for it."""
    run_on_worker(job, threading.Event())
