"""The engine thread first at the GIL (opt-in: `--switch-interval engine`).

The HTTP loop writes each row's chunk while the engine thread builds and runs the next step.
Python makes a thread that waits for the GIL wait one switch interval (5 ms) before it may force
the holder off. So the engine, back from a device wait, can wait up to 5 ms for the loop, and
the loop, woken by the step's tokens, preempts the engine's graph build after one interval.
Here the interval is long while the engine builds a step (the loop writes during the step's
device waits instead) and short around those waits (the engine takes the GIL back quickly).
A lone serial row keeps the short interval throughout: the loop has one frame a token to write.
The readers of a batched step's tokens are woken when the next step is queued, not when the
tokens are read (`HeldWake`): their frames are then written while the engine waits inside
`mx.async_eval` / `mx.eval` (which release the GIL), not between its turns, where the engine
builds the next step (session 43: a fleet step's build took 4.2 ms against 1.8 ms alone).
"""

import os
import sys
from dataclasses import dataclass, field

from .handle import Watchers, wake


class HeldWake:
    """Readers' wake-ups held from one batched step's events until the next step is queued."""

    def __init__(self) -> None:
        self._watchers: Watchers = []

    def hold(self, watchers: Watchers) -> None:
        self.release()  # still held: the step since took mlx-lm's own path (no release there)
        self._watchers = watchers

    def release(self) -> None:
        if self._watchers:
            watchers, self._watchers = self._watchers, []
            wake(watchers)


WAIT_S = 0.0002  # the interval around a step's device waits


@dataclass(frozen=True)
class StepPhases:
    build_s: float  # while the step's graph is built: how long a waiting thread waits
    wait_s: float = WAIT_S  # from the step's async_eval on
    held: HeldWake = field(default_factory=HeldWake, compare=False)  # the last step's readers
    hold_wakes: bool = True  # False: readers woken as their tokens are read (MLXD_HELD_WAKE=0)

    def building(self) -> None:
        sys.setswitchinterval(self.build_s)

    def waiting(self) -> None:
        """The step is built and about to be queued: the short interval, the readers woken."""
        sys.setswitchinterval(self.wait_s)
        self.held.release()


def step_phases(setting: float | str | None) -> StepPhases | None:
    """`--switch-interval engine`: phases around Python's interval as it is now; else None.
    MLXD_HELD_WAKE=0 wakes readers at once, as without phases (for A/B runs)."""
    if setting != "engine":
        return None
    hold = os.environ.get("MLXD_HELD_WAKE", "1")
    if hold not in ("0", "1"):
        raise ValueError(f"MLXD_HELD_WAKE={hold!r}: 0 or 1")
    return StepPhases(sys.getswitchinterval(), hold_wakes=hold == "1")
