"""One background thread draining a bounded queue of jobs; offering never blocks the caller."""

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mlxd.store")
_STOP = object()


class Writer:
    def __init__(self, job: Callable[[Any], None], depth: int, name: str = "mlxd-ssd-writer"):
        self._job = job
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._idle = threading.Condition()
        self._outstanding = 0  # queued + the one being written
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def full(self) -> bool:
        return self._queue.full()

    def offer(self, item: Any) -> bool:
        """Enqueue `item` unless the queue is full or the writer is closed (then False)."""
        with self._idle:
            if self._closed:
                return False
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                return False
            self._outstanding += 1
            return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every offered item has been handled; False when `timeout` ran out."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        with self._idle:
            if self._closed:
                return
            self._closed = True  # offers now fail; what is queued is still written
        self._queue.put(_STOP)  # blocks only while the queue is full of real work
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            try:
                self._job(item)
            except Exception:  # noqa: BLE001 - one bad entry must not stop the writer
                log.exception("the SSD writer failed on an entry")
            finally:
                del item  # drop the buffers before signalling: flushed means released
                with self._idle:
                    self._outstanding -= 1
                    self._idle.notify_all()
