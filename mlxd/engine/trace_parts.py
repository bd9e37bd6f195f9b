"""A join's parts for MLXD_TRACE: seconds of the batched prefill's merge, forward passes, roll,
move to decoding and first step, and the rows' snapshots, in the turn's trace line (`parts`).

Off unless the trace is on (`start` returns None and `stop` returns at once). On, each part ends
in a sync, so the GPU time of the lazy work before it lands in that part; the arrays, and so the
bits, are the same.
"""

import time
from typing import Any

import mlx.core as mx

_parts: dict[str, Any] | None = None


def enable() -> None:
    global _parts
    _parts = {}


def disable() -> None:
    global _parts
    _parts = None


def take() -> dict[str, Any] | None:
    """This turn's parts (None when nothing was timed), and a fresh record for the next."""
    global _parts
    if not _parts:
        return None
    out, _parts = _parts, {}
    return out


def note(key: str, value: Any) -> None:
    """A fact about the turn's prefill (e.g. its padded shape), kept beside its parts."""
    if _parts is not None:
        _parts.setdefault(key, value)


def start() -> float | None:
    return None if _parts is None else time.perf_counter()


def stop(name: str, tic: float | None, sync: Any = None) -> None:
    """Add the seconds since `tic` to `name`, after evaluating `sync` (arrays), if timing."""
    if tic is None or _parts is None:
        return
    if sync is not None:
        mx.eval(sync)
    _parts[name] = round(_parts.get(name, 0.0) + time.perf_counter() - tic, 6)
