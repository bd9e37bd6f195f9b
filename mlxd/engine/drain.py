"""How fast the waiting queue drains: when requests got rows lately, so a refused client can be
told when to come back (a server's Retry-After) instead of always "in a second"."""

import time
from collections import deque
from collections.abc import Callable

HORIZON = 60.0  # seconds of recent admissions the rate is measured over


class DrainRate:
    """Rows handed out over the last HORIZON seconds (the caller holds its lock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.times: deque[float] = deque()  # one entry per row handed out

    def admitted(self, rows: int) -> None:
        if rows:
            now = self.clock()
            self.times.extend([now] * rows)
            self._forget(now)

    def seconds_for(self, rows: int) -> float:
        """Seconds until `rows` more rows are handed out at the recent rate (inf: none lately)."""
        now = self.clock()
        self._forget(now)
        if not self.times:
            return float("inf")
        # At least a second of span: a wave admitted at once is not an infinite rate.
        rate = len(self.times) / max(now - self.times[0], 1.0)
        return rows / rate

    def _forget(self, now: float) -> None:
        while self.times and self.times[0] < now - HORIZON:
            self.times.popleft()
