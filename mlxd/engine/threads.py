"""Worker threads for MLX work that never exit.

MLX (0.32, CPU backend) can abort the process at exit ("terminate called without an active
exception") when a thread that ran MLX ops has finished; threads that are still alive are safe.
So an engine's loop runs on a pooled daemon thread that goes back to the pool when it ends.
"""

import logging
import queue
import threading
from collections.abc import Callable

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
