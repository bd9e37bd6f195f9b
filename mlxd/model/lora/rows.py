"""The adapter slot of each batch row for the next model call.

The engine sets it before every model call (slot 0: no adapter); every MultiLoRALinear of the
model holds the same object and reads it while the call builds its graph, so setting it again
after the call returned never reaches that call's arrays (MLX keeps the ones it read).
"""

from collections.abc import Sequence

import mlx.core as mx


class SlotRows:
    """Per-row slot ids: host ints for the branch choice, one uint32 array for the gathers."""

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity  # slots 0..capacity-1 exist (AdapterSlots keeps it current)
        self.slots: tuple[int, ...] | None = None
        self.ids: mx.array | None = None
        self.lhs: mx.array | None = None  # arange(B): row i of x goes with ids[i]
        self.uniform: int | None = None  # the one slot of every row, when they share it
        self.present: frozenset[int] = frozenset()  # the non-zero slots among the rows

    def set(self, slots: Sequence[int]) -> None:
        """Slots for the next call, one per batch row (row order of the model's input)."""
        self.slots = tuple(int(s) for s in slots)
        if not self.slots or min(self.slots) < 0 or max(self.slots) >= self.capacity:
            raise ValueError(f"slot ids must be in [0, {self.capacity}), one per row: {slots}")
        self.ids = mx.array(self.slots, dtype=mx.uint32)
        self.lhs = mx.arange(len(self.slots), dtype=mx.uint32)
        self.uniform = self.slots[0] if len(set(self.slots)) == 1 else None
        self.present = frozenset(self.slots) - {0}

    def clear(self) -> None:
        """No adapter for any row: every wrapped linear gives its base output."""
        self.__init__(self.capacity)
