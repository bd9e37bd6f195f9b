"""One Engine per model for the Python API, closed when the model is garbage-collected."""

import threading
import weakref
from typing import Any

from .engine import Engine

_engines: dict[int, Engine] = {}
_lock = threading.Lock()


def engine_for(model: Any) -> Engine:
    """The API's engine for `model` (created on first use)."""
    key = id(model)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = Engine(model, weak_model=True)
            weakref.finalize(model, _drop, key)
        return engine


def _drop(key: int) -> None:
    with _lock:
        engine = _engines.pop(key, None)
    if engine is not None:
        engine.close()
