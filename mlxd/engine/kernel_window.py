"""MLXD_KERNELS=FILE: each kernel's GPU time over a window of the running engine's turns, for
device runs (MLX-CUDA with PyTorch's CUPTI-backed profiler in the process).

MLXD_KERNELS_AT="ROWS START TURNS" (default "32 60 40"): the window opens at the START-th turn
with at least ROWS rows running and closes TURNS such turns later (or at the first turn with
fewer rows). FILE then gets kernel_profile's summary per turn (wall, GPU busy, kernels, families,
the donation race's whole-layer copies), and the host's wall time a turn. One window a process.
It answers what a probe of the step alone cannot: whether a fleet's step, slower than the same step
alone, spends the difference on the GPU (copies) or waiting for the host (the GIL, the HTTP
side). docs/performance.md §1. Unset: `NoWindow`, whose `turn` does nothing.
"""

import logging
import os
import threading
import time
from collections import Counter
from typing import Any

log = logging.getLogger("mlxd.engine")


class NoWindow:
    def turn(self, rows: int) -> None:
        pass


class KernelWindow(NoWindow):
    def __init__(self, path: str, rows: int, start: int, turns: int, profiler: Any) -> None:
        self.path, self.rows, self.start, self.turns = path, rows, start, turns
        self._profiler = profiler  # torch.profiler's (`_cupti`); tests pass a stand-in
        self._seen = self._profiled = self._turns = 0  # turns seen full, profiled full, in all
        self._open: Any = None
        self._t0 = 0.0
        self.done = False
        self.clock = StepClock()  # the engine hands it to its batched step (decode_step.py)
        self.order = "pipelined"  # the engine's step order, for the report's first line

    @staticmethod
    def of(path: str | None, at: str) -> NoWindow:
        """The window `EngineConfig.kernels` / `kernels_at` ask for (validated there)."""
        if not path:
            return NoWindow()
        rows, start, turns = (int(x) for x in at.split())
        try:
            profiler = _cupti()
        except (ImportError, OSError, RuntimeError) as e:  # no torch, or no CUDA for it
            log.warning("MLXD_KERNELS is set but PyTorch's profiler is not usable: %r", e)
            return NoWindow()
        return KernelWindow(path, rows, start, turns, profiler)

    def turn(self, rows: int) -> None:
        """Called after each engine turn with the rows then running."""
        if self.done:
            return
        try:
            if self._open is not None:
                self._turns += 1
                if rows >= self.rows:
                    self._profiled += 1
                if rows < self.rows or self._profiled >= self.turns:
                    self._close()
                return
            if rows >= self.rows:
                self._seen += 1
                if self._seen >= self.start:
                    self._begin()
        except Exception:  # noqa: BLE001 - raised into the engine's turn, it would end every row
            log.exception("MLXD_KERNELS' window failed; it is closed, the rows go on")
            self.done = True

    def _begin(self) -> None:
        self._open = self._profiler
        self._open.__enter__()
        self.clock.reset()
        self._t0 = time.perf_counter()

    def _close(self) -> None:
        wall_ms = (time.perf_counter() - self._t0) * 1e3 / max(self._turns, 1)
        self.done = True
        self._open.__exit__(None, None, None)
        lines = [
            f"== engine window: {self._profiled} turns of >= {self.rows} rows from the "
            f"{self.start}-th, step order {self.order}: "
            f"host wall {wall_ms:.3f} ms a turn",
            f"  {self.clock.line()}; the rest of a turn (the engine's, mlx-lm's own work) "
            f"{wall_ms - self.clock.engine_ms():.3f}",
        ]
        try:
            lines += self._summary(max(self._turns, 1))
        except (OSError, RuntimeError, ValueError) as e:  # the export or its reading: the host
            lines.append(f"no summary: {e!r}")  # lines above still go out
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")

    def _summary(self, turns: int) -> list[str]:
        import json
        import tempfile

        # The trace reading, imported only when a window closes.
        from .kernel_profile import kernels, summarize

        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "trace.json")
            self._open.export_chrome_trace(trace)
            with open(trace) as f:
                ks = kernels(json.load(f))
        return summarize(ks, turns, top=12)


def _cupti() -> Any:
    """torch.profiler over CUDA kernels, made at the engine's start: importing torch takes
    seconds, which mid-fleet would stall the rows."""
    import torch.profiler as tp

    return tp.profile(activities=[tp.ProfilerActivity.CUDA])


# Host time of a batched decode step's parts, summed over steps (MLXD_KERNELS' window): `build`
# (the graph, in Python), `encode` (`mx.async_eval`: MLX encodes, and on CUDA without graphs
# launches, every kernel), `wait` (reading the last step's tokens: the host waiting for the GPU).
# A step whose `wait` is near zero is host-bound; the rest of an engine turn is the engine's and
# mlx-lm's own work. The thread order's encoder (overlap.py) marks its own parts, named `enc ...`,
# from its thread: they overlap the engine's, so they are not part of the turn's sum.

OWN = "enc "  # the prefix of the parts another thread marks beside the engine's


class StepClock:
    def __init__(self) -> None:
        self.sums: Counter[str] = Counter()
        self.steps = 0
        self._t = threading.local()  # each thread's last mark

    def start(self) -> None:
        self.steps += 1
        self.begin()

    def begin(self) -> None:
        """This thread's parts start now (no step counted: the encoder's thread)."""
        self._t.at = time.perf_counter()

    def mark(self, part: str) -> None:
        """The host time since this thread's last mark (or start) goes to `part`."""
        now = time.perf_counter()
        self.sums[part] += now - getattr(self._t, "at", now)
        self._t.at = now

    def engine_ms(self) -> float:
        """The engine thread's parts, ms a step (what the turn's wall holds)."""
        own = sum(v for k, v in self.sums.items() if not k.startswith(OWN))
        return own * 1e3 / max(self.steps, 1)

    def reset(self) -> None:
        self.sums.clear()
        self.steps = 0

    def line(self) -> str:
        """Mean ms a step by part, in the order first seen."""
        n = max(self.steps, 1)
        parts = ", ".join(f"{k} {v * 1e3 / n:.3f}" for k, v in self.sums.items())
        return f"host ms a step ({self.steps} steps): {parts or 'no batched step'}"
