"""Instruments for device runs. MLXD_TRACE=FILE: one JSON line per engine turn (where the
loop's time went).

A line has the turn's start (`t`, seconds since the engine started), the host time of each phase
(`admit` (with any idle wait), `fork`, `serial`, `batch`, `tick`), the rows running and waiting,
what the paths counter gained (rows admitted serial / batched, moves), BatchGenerator's
counters over the turn (prompt tokens and time, decode steps and time), and a join's `parts`
(py: merge, forward, roll, first step, snapshots, the padded shape), and for the
rows it admitted when their requests reached the server (`came`) and the engine (`queued`),
first and last. Unset: every call is a no-op (`NoTrace`).

Lines are written out once a second, when the engine goes idle and at close, not per turn: a
write releases the GIL, where the HTTP thread can take it for its burst of frames. H200 traces
written per turn had a median 1.3-1.5 ms a 32-row step outside every phase, between one turn's
line and the next turn.
"""

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

import mlx.core as mx

Counters = tuple[int, float, int, float]


class NoTrace:
    """The engine's trace when MLXD_TRACE is unset: each call returns at once."""

    def begin(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass

    def admitted(self, handles: list[Any]) -> None:
        pass

    def batches(self, batches: dict[Any, Any], before: bool) -> None:
        pass

    def end(self, active: Callable[[], list[Any]], waiting: int, paths: Counter[str]) -> None:
        pass

    def idle(self) -> None:
        pass

    def close(self) -> None:
        pass


class Trace(NoTrace):
    FLUSH_S = 1.0  # a killed server loses at most this much of a busy stretch

    def __init__(self, path: str) -> None:
        # A 1 MB buffer: no write (and no GIL release) per turn. The lock: a driver's thread can
        # write a turn's line while the engine thread flushes before it waits (driver.py).
        self._out: IO[str] = open(path, "a", buffering=1 << 20)  # noqa: SIM115 - closed by the engine
        self._io = threading.Lock()
        self._t0 = self._last = self._flushed = time.perf_counter()
        self._paths: Counter[str] = Counter()
        self._rec: dict[str, Any] = {}
        self._before: list[tuple[Any, Any, Counters]] = []
        enable()  # a join's parts, synced, in its turn's line (py)

    @staticmethod
    def of(path: str | None) -> NoTrace:
        return Trace(path) if path else NoTrace()

    def begin(self) -> None:
        self._last = now = time.perf_counter()
        self._rec = {"t": round(now - self._t0, 6)}

    def mark(self, phase: str) -> None:
        """The host time since the last mark goes to `phase`."""
        now = time.perf_counter()
        self._rec[phase] = round(now - self._last, 6)
        self._last = now

    def admitted(self, handles: list[Any]) -> None:
        """The turn's joiners: when their requests reached the server (`came`) and the engine
        (`queued`), first and last, on the trace's clock: a wave's wait before its turn."""
        for key, times in (("came", [h.arrived for h in handles if h.arrived is not None]),
                           ("queued", [h.submitted for h in handles])):  # fmt: skip
            if times:
                self._rec[key] = [round(min(times) - self._t0, 6), round(max(times) - self._t0, 6)]

    def batches(self, batches: dict[Any, Any], before: bool) -> None:
        """BatchGenerator's prompt / decode counters around the batch phase (deltas per turn,
        a batch that closed in it included)."""
        if before:
            self._before = [(fmt, b, _counters(b)) for fmt, b in batches.items()]
            return
        for fmt, b, was in self._before:
            d = [x - y for x, y in zip(_counters(b), was, strict=True)]
            rec = {"fmt": str(fmt), "rows": len(b), "prompt_tokens": d[0],
                   "prompt_s": round(d[1], 6), "decode_steps": d[2],
                   "decode_s": round(d[3], 6)}  # fmt: skip
            self._rec.setdefault("gen", []).append(rec)
        self._before = []

    def end(self, active: Callable[[], list[Any]], waiting: int, paths: Counter[str]) -> None:
        moved = paths - self._paths
        self._paths = Counter(paths)
        self._rec.update(active=len(active()), waiting=waiting)
        if moved:
            self._rec["paths"] = dict(moved)
        if parts := take():
            self._rec["parts"] = parts
        with self._io:
            self._out.write(json.dumps(self._rec) + "\n")
        if self._last - self._flushed > self.FLUSH_S:
            self.idle()

    def idle(self) -> None:
        """Write out the lines kept so far (the engine is about to wait for work)."""
        with self._io:
            self._out.flush()
        self._flushed = time.perf_counter()

    def close(self) -> None:
        disable()
        with self._io:
            self._out.close()


def _counters(batch: Any) -> Counters:
    c = batch.gen._counters  # mlx-lm's BatchCounters
    return c.prompt_tokens, c.prompt_time, c.generation_steps, c.decode_time


# A join's parts for MLXD_TRACE: seconds of the batched prefill's merge, forward passes, roll,
# move to decoding and first step, and the rows' snapshots, in the turn's trace line (`parts`).
#
# Off unless the trace is on (`start` returns None and `stop` returns at once). On, each part ends
# in a sync, so the GPU time of the lazy work before it lands in that part; the arrays, and so the
# bits, are the same.

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
