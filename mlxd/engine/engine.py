"""The Engine: one thread owns all MLX work; callers submit requests and read events.

Rows are admitted FIFO up to `batch`; each loop turn gives every active row one unit of work
(a prefill chunk or a decode step). Today every row runs on its own serial caches, so each row
is bit-exact with mlx-lm's generate_step whatever else runs; merging rows into one batched step
is the engine issue's next step.
"""

import collections
import threading
import time
import weakref
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .handle import RequestHandle
from .request import DoneEvent, GenerationRequest
from .rng import KeyOwner
from .serial import SerialRow, validate


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
        self.batch, self.max_queue = batch, max_queue
        self._waiting: collections.deque[tuple[GenerationRequest, RequestHandle]] = (
            collections.deque()
        )
        self._active: list[tuple[SerialRow, RequestHandle]] = []
        self._wake = threading.Condition()
        self._closed = False
        self._keys = KeyOwner()
        self._thread = threading.Thread(target=self._loop, name="mlxd-engine", daemon=True)
        self._thread.start()

    @property
    def model(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this engine was garbage-collected")
        return model

    def submit(self, req: GenerationRequest) -> RequestHandle:
        validate(req, self.model)
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
            self._thread.join(timeout=30)

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
        handle.put(DoneEvent(reason, error, random_key=self._keys.leave(row)))
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

    def _loop(self) -> None:
        while True:
            self._admit()
            if self._closed:
                for _, handle in self._active:
                    handle.put(DoneEvent("cancelled"))
                with self._wake:
                    for _, handle in self._waiting:
                        handle.put(DoneEvent("cancelled"))
                return
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
                time.sleep(0)
                if not self._active:
                    mx.clear_cache()
