"""How a job's driver talks to whoever runs it: events (messages, progress, metrics,
checkpoints) as plain dicts handed to an `emit` callable, and a cooperative stop flag."""

import threading
import time
from collections.abc import Callable
from typing import Any


class JobError(Exception):
    """An expected failure with a stable code (e.g. "nonfinite_adapter", "invalid_file")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Reporter:
    """The driver's side of a job: every call becomes one event dict for `emit`."""

    def __init__(self, emit: Callable[[dict], None], stop: threading.Event | None = None) -> None:
        self._emit = emit
        self._stop = stop or threading.Event()
        self._last_progress = -1.0

    def _send(self, event: dict) -> None:
        event.setdefault("created_at", time.time())
        self._emit(event)

    def message(self, text: str, level: str = "info", **data: Any) -> None:
        self._send({"type": "message", "level": level, "message": text, "data": data or None})

    def progress(self, fraction: float, stage: str = "", eta_s: float | None = None) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        if fraction == self._last_progress and not stage:
            return  # a repeat says nothing new
        self._last_progress = fraction
        self._send({"type": "progress", "progress": fraction, "stage": stage, "eta_s": eta_s})

    def metrics(self, step: int, message: str = "", **data: Any) -> None:
        text = message or f"Step {step}: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items()
        )
        self._send(
            {"type": "metrics", "level": "info", "message": text, "data": {"step": step, **data}}
        )

    def checkpoint(self, step: int, path: str, **metrics: Any) -> None:
        self._send(
            {"type": "checkpoint", "step": step, "path": path, "metrics": {"step": step, **metrics}}
        )

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @classmethod
    def collect(cls) -> "Collected":
        """A reporter that keeps its events in `.events` (tests and in-process runs)."""
        return Collected()


class Collected(Reporter):
    def __init__(self) -> None:
        self.events: list[dict] = []
        super().__init__(self.events.append)

    def stop(self) -> None:
        self._stop.set()
