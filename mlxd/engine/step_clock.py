"""Host time of a batched decode step's parts, summed over steps (MLXD_KERNELS' window):
`build` (the graph, in Python), `wait first` (MLXD_STEP_ORDER=wait's read of the last step),
`encode` (`mx.async_eval`: MLX encodes, and on CUDA without graphs launches, every kernel),
`wait` (reading the last step's tokens: the host waiting for the GPU). A step whose `wait` is
near zero is host-bound; the rest of an engine turn is the engine's and mlx-lm's own work."""

import time
from collections import Counter


class StepClock:
    def __init__(self) -> None:
        self.sums: Counter[str] = Counter()
        self.steps = 0
        self._t = 0.0

    def start(self) -> None:
        self.steps += 1
        self._t = time.perf_counter()

    def mark(self, part: str) -> None:
        """The host time since the last mark (or start) goes to `part`."""
        now = time.perf_counter()
        self.sums[part] += now - self._t
        self._t = now

    def reset(self) -> None:
        self.sums.clear()
        self.steps = 0

    def line(self) -> str:
        """Mean ms a step by part, in the order first seen."""
        n = max(self.steps, 1)
        parts = ", ".join(f"{k} {v * 1e3 / n:.3f}" for k, v in self.sums.items())
        return f"host ms a step ({self.steps} steps): {parts or 'no batched step'}"
