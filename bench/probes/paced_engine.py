"""A stand-in engine for measuring the HTTP side alone: every `step_s` it emits one token to
every row, as the real engine's batched turn does (queued quietly, one wake-up per step). Each
step first holds the GIL for `gil_s` (the real step's Python graph build), then waits without
it for the rest of the step (the real step's `mx.async_eval`). The steps it achieves, against
the ones it was paced at, show what the event loop's GIL time costs the engine.
`work`: the build is a fixed amount of Python work (as long as `gil_s` alone), so the loop's
frames stretch it as they stretch a real build, the device part is a fixed `step_s - gil_s`,
and `rest_s` of Python work follows the tokens (the engine's turn before its next build);
`phases`: `--switch-interval engine`'s intervals and its held
wake-up (engine/overlap.py): the readers woken as the next step is queued."""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine.overlap import StepPhases
from mlxd.engine.request import (
    DoneEvent,
    GenerationRequest,
    RequestHandle,
    TokenEvent,
    Watchers,
    wake,
)


@dataclass
class _Row:
    handle: RequestHandle
    max_tokens: int
    prompt_tokens: int
    submitted: float
    sent: int = 0


@dataclass
class PacedEngine:
    pieces: list[tuple[int, str]]  # (token id, its text), emitted in turn
    step_s: float = 0.010
    gil_s: float = 0.0023
    batch: int = 32
    sharing: Any = None
    alive: bool = True
    steps: list[float] = field(default_factory=list)  # each step's wall time, seconds
    _rows: list[_Row] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _work: threading.Event = field(default_factory=threading.Event)
    _tokens: int = 0
    on_close: Callable[[], None] | None = None
    work: bool = False
    phases: StepPhases | None = None
    builds: list[float] = field(default_factory=list)  # each build's wall time (work mode)
    rest_s: float = 0.0  # work mode: the turn's own Python work between its tokens and the build

    def __post_init__(self) -> None:
        self._spins = _calibrate(self.gil_s) if self.work else 0
        self._rest_spins = _calibrate(self.rest_s) if self.work and self.rest_s > 0 else 0
        self._thread = threading.Thread(target=self._loop, name="paced-engine", daemon=True)
        self._thread.start()
        self.native_id: int | None = None

    def submit(self, req: GenerationRequest, arrival: Any = None) -> RequestHandle:
        handle = RequestHandle()
        row = _Row(handle, req.max_tokens, int(req.prompt.size), time.perf_counter())
        with self._lock:
            self._rows.append(row)
        self._work.set()
        return handle

    def submit_n(self, req: GenerationRequest, n: int, arrival: Any = None) -> list[RequestHandle]:
        return [self.submit(req) for _ in range(n)]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            active = len(self._rows)
        return {
            "active": active,
            "waiting": 0,
            "tokens_generated": self._tokens,
            "tokens_per_s": 0.0,
            "kv_bytes_reserved": 0,
            "kv_budget": None,
            "kv_bytes_per_token": {},
            "paths": {},
        }

    def announce_scheme(self, bits: int, group_size: int) -> None:
        pass

    def close(self) -> None:
        if self.alive and self.on_close is not None:
            self.on_close()
        self.alive = False
        self._work.set()

    def _loop(self) -> None:
        self.native_id = threading.get_native_id()
        while self.alive:
            if not self._rows:
                self._work.wait(0.1)
                self._work.clear()
                continue
            start = time.perf_counter()
            self._build(start)
            rest = self.step_s - (self.gil_s if self.work else time.perf_counter() - start)
            if rest > 0:
                time.sleep(rest)  # the device's part of the step: the GIL is free
            self._emit()
            _spin(self._rest_spins)  # the engine's turn after the tokens, before the next build
            self.steps.append(time.perf_counter() - start)
        if self.phases is not None:
            self.phases.held.release()

    def _build(self, start: float) -> None:
        if self.phases is not None:
            self.phases.building()
        if self.work:
            _spin(self._spins)
        while time.perf_counter() - start < self.gil_s:  # Python work: holds the GIL
            pass  # (work mode: spun already; this only ends a build shorter than alone)
        self.builds.append(time.perf_counter() - start)
        if self.phases is not None:
            self.phases.waiting()  # the step is queued: held readers woken

    def _wake(self, watchers: Watchers, more: bool) -> None:
        if self.phases is not None and more:
            self.phases.held.hold(watchers)
        else:
            if self.phases is not None:
                self.phases.held.release()
            wake(watchers)

    def _emit(self) -> None:
        with self._lock:
            rows = list(self._rows)
        watchers, ended = [], []
        for row in rows:
            if row.handle.cancelled:  # the client went away: the row ends, as in the engine
                ended.append(row)
                watchers += row.handle.put_quiet(DoneEvent("cancelled", completion_tokens=row.sent))
                continue
            token, text = self.pieces[(row.sent + id(row)) % len(self.pieces)]
            row.sent += 1
            finish = "length" if row.sent >= row.max_tokens else None
            watchers += row.handle.put_quiet(TokenEvent(token, None, text, finish))  # type: ignore[arg-type]
            if finish is not None:
                ended.append(row)
                timings = {"queue_s": 0.0, "ttft_s": time.perf_counter() - row.submitted}
                done = DoneEvent("length", prompt_tokens=row.prompt_tokens,
                                 completion_tokens=row.sent, timings=timings)  # fmt: skip
                watchers += row.handle.put_quiet(done)
        self._tokens += len(rows) - len(ended)
        if ended:
            with self._lock:
                self._rows = [r for r in self._rows if r not in ended]
        self._wake(watchers, bool(self._rows))


def _spin(n: int) -> int:
    total = 0
    for i in range(n):  # pure Python: holds the GIL, as a step's graph build does
        total += i & 7
    return total


def _calibrate(seconds: float) -> int:
    """Spins that take `seconds` alone (the fastest of a few tries)."""
    n, best = 20_000, float("inf")
    for _ in range(5):
        t = time.perf_counter()
        _spin(n)
        best = min(best, time.perf_counter() - t)
    return max(1, int(n * seconds / best))
