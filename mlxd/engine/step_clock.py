"""Host time of a batched decode step's parts, summed over steps (MLXD_KERNELS' window):
`build` (the graph, in Python), `wait first` (MLXD_STEP_ORDER=wait's read of the last step),
`encode` (`mx.async_eval`: MLX encodes, and on CUDA without graphs launches, every kernel),
`wait` (reading the last step's tokens: the host waiting for the GPU). A step whose `wait` is
near zero is host-bound; the rest of an engine turn is the engine's and mlx-lm's own work.
The thread order's encoder (encoder.py) marks its own parts, named `enc ...`, from its thread:
they overlap the engine's, so they are not part of the turn's sum."""

import threading
import time
from collections import Counter

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
