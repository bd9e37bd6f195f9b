"""The Engine: one thread owns all MLX work; callers submit requests and read events.

Rows are admitted FIFO up to `batch`; each loop turn gives every active row one unit of work
(a prefill chunk or a decode step). Today every row runs on its own serial caches, so each row
is bit-exact with mlx-lm's generate_step whatever else runs; merging rows into one batched step
is the engine issue's next step.
"""

import atexit
import collections
import threading
import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn

# mlx-lm's thread-local generation stream: each thread that enters it gets its own stream.
from mlx_lm.generate import generation_stream

from .handle import RequestHandle
from .request import DoneEvent, GenerationRequest
from .rng import KeyOwner
from .serial import SerialRow, validate
from .threads import run_on_worker

_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # An engine thread still inside MLX at interpreter exit aborts the process: join them first.
    for engine in list(_live):
        engine.close()


def materialize(*trees: Any) -> None:
    """Evaluate every array reachable from modules/caches in the calling thread.

    MLX streams are per thread: a lazy array built in the caller (e.g. a rope module's private
    `_freqs`) cannot be evaluated on the engine thread, so it is computed here first.
    """
    arrays: list[mx.array] = []
    seen: set[int] = set()

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, mx.array):
            arrays.append(x)
        elif isinstance(x, dict | list | tuple):
            for v in x.values() if isinstance(x, dict) else x:
                visit(v)
        elif hasattr(x, "__dict__") and not callable(x) or isinstance(x, nn.Module):
            for v in vars(x).values():
                visit(v)
            if isinstance(x, nn.Module):
                for v in x.values():
                    visit(v)

    for tree in trees:
        visit(tree)
    mx.eval(arrays)


class Overloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class Engine:
    def __init__(
        self, model: Any, batch: int = 8, max_queue: int = 1024, weak_model: bool = False
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        # weak_model: the Python API's engines must not keep a dropped model alive.
        self._model = weakref.ref(model) if weak_model else (lambda: model)
        materialize(model)
        self.batch, self.max_queue = batch, max_queue
        self._waiting: collections.deque[tuple[GenerationRequest, RequestHandle]] = (
            collections.deque()
        )
        self._active: list[tuple[SerialRow, RequestHandle]] = []
        self._wake = threading.Condition()
        self._closed = False
        self._keys = KeyOwner()
        self._ended: list[tuple[RequestHandle, DoneEvent]] = []
        self._stopped = threading.Event()
        self._thread = run_on_worker(self._loop, self._stopped)
        _live.add(self)

    @property
    def model(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this engine was garbage-collected")
        return model

    def submit(self, req: GenerationRequest) -> RequestHandle:
        validate(req, self.model)
        materialize(req.prompt, req.input_embeddings, req.prompt_cache)
        handle = RequestHandle()
        with self._wake:
            if self._closed:
                raise RuntimeError("engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise Overloaded(f"{len(self._waiting)} requests waiting (max_queue)")
            self._waiting.append((req, handle))
            self._wake.notify()
        return handle

    def stats(self) -> dict[str, int]:
        with self._wake:
            return {"active": len(self._active), "waiting": len(self._waiting)}

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._stopped.wait(timeout=30)

    # engine thread
    def _admit(self) -> None:
        with self._wake:
            while not self._active and not self._waiting and not self._closed:
                self._wake.wait()
            while self._waiting and len(self._active) < self.batch:
                req, handle = self._waiting.popleft()
                if handle.cancelled:
                    handle.put(DoneEvent("cancelled"))
                    continue
                try:
                    self._active.append((SerialRow(self.model, req, generation_stream), handle))
                except Exception as e:  # noqa: BLE001 - the caller re-raises it
                    handle.put(DoneEvent("error", e))

    def _end(self, row: SerialRow, handle: RequestHandle, reason: str, error=None) -> bool:
        # Delivered by _turn once the row's caches are released.
        self._ended.append((handle, DoneEvent(reason, error, random_key=self._keys.leave(row))))
        return True

    def _work(self, row: SerialRow, handle: RequestHandle) -> bool:
        """One unit of work for a row; True when the row has ended."""
        if handle.cancelled:
            return self._end(row, handle, "cancelled")
        self._keys.enter(row, row.req.random_key)
        if row.prefilling:
            row.prefill_chunk()
            return False
        event = row.decode()
        if event is None:
            return self._end(row, handle, "length")
        handle.put(event)
        if event.token in row.req.stop_token_ids:
            return self._end(row, handle, "stop")
        return False

    def _turn(self) -> None:
        """One unit of work for every active row; ended rows leave (a method, so no local
        variable keeps a finished row's caches alive while the thread waits)."""
        finished = []
        for row, handle in self._active:
            try:
                if self._work(row, handle):
                    finished.append(row)
            except Exception as e:  # noqa: BLE001 - one bad row never stops the engine
                self._end(row, handle, "error", e)
                finished.append(row)
        if finished:
            self._active = [(r, h) for r, h in self._active if r not in finished]
            del finished, row
            if not self._active:
                mx.clear_cache()
        ended, self._ended = self._ended, []
        for handle, event in ended:
            handle.put(event)

    def _shutdown(self) -> None:
        for _, handle in self._active:
            handle.put(DoneEvent("cancelled"))
        self._active = []
        with self._wake:
            for _, handle in self._waiting:
                handle.put(DoneEvent("cancelled"))
            self._waiting.clear()

    def _loop(self) -> None:
        while True:
            self._admit()
            if self._closed:
                self._shutdown()
                return
            self._turn()
