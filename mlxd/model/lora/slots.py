"""Resident adapters over one base model: each named adapter owns a slot (slot 0 is "no
adapter"), and every linear some adapter targets holds them stacked by slot (stack.py) behind
a MultiLoRALinear (install.py). Adding or removing one happens between model calls; the engine
must not remove an adapter a live row still uses (its slot would read zeros or a newcomer)."""

from collections.abc import Sequence
from pathlib import Path

import mlx.nn as nn

from .adapter import Adapter, AdapterError, read_adapter
from .install import install
from .rows import SlotRows
from .stack import Entry, TargetStack, dims, dora_gain
from .targets import lora_targets


class AdapterSlots:
    """Named adapters in stable slots over `model`; `rows` is what the engine sets per call."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rows = SlotRows()
        self.stacks: dict[str, TargetStack] = {}
        self._slot: dict[str, int] = {}
        self._adapters: dict[int, Adapter] = {}

    @property
    def names(self) -> list[str]:
        return list(self._slot)

    @property
    def capacity(self) -> int:
        """Slots 0..capacity-1: one past the highest slot in use."""
        return max(self._adapters, default=0) + 1

    def slot(self, name: str | None) -> int:
        """The slot of adapter `name` (None: 0, the base model)."""
        if name is None:
            return 0
        if name not in self._slot:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        return self._slot[name]

    def set_rows(self, names: Sequence[str | None]) -> None:
        """Each batch row's adapter by name (None: none), for the next model call."""
        self.rows.set([self.slot(n) for n in names])

    def add(self, name: str, path: str | Path) -> int:
        """Load the adapter folder `path` as `name` into the lowest free slot; returns the slot."""
        if name in self._slot:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        adapter = read_adapter(name, path)
        entries = self._entries(adapter)
        slot = next(s for s in range(1, len(self._adapters) + 2) if s not in self._adapters)
        touched = []
        try:
            for target, (linear, entry) in entries.items():
                stack = self.stacks.get(target) or TargetStack(target, linear)
                stack.put(slot, entry)
                self.stacks[target] = stack
                touched.append(stack)
        except AdapterError:
            for stack in touched:
                stack.drop(slot)
            raise
        self._slot[name], self._adapters[slot] = slot, adapter
        self._restack()
        install(self.model, self.stacks, self.rows)
        return slot

    def remove(self, name: str) -> None:
        """Free `name`'s slot; its linears stay wrapped (rows of other slots keep their bits)."""
        slot = self.slot(name)
        for stack in self.stacks.values():
            stack.drop(slot)
        del self._slot[name], self._adapters[slot]
        self._restack()

    def nbytes(self, name: str) -> int:
        """The bytes `name` holds: its own arrays and its padded rows of the slot stacks."""
        slot = self.slot(name)
        return sum(stack.nbytes_of(slot) for stack in self.stacks.values())

    def _restack(self) -> None:
        capacity = self.capacity
        self.rows.capacity = capacity
        self.rows.clear()  # the next call's slots are set anew, against the new capacity
        for stack in self.stacks.values():
            stack.rebuild(capacity)

    def _entries(self, adapter: Adapter) -> dict[str, tuple[nn.Module, Entry]]:
        """Each adapted module's base and entry, refused as mlx-lm's loader would refuse them
        (a tensor outside the targets, a wrong shape) or where a mixed batch cannot serve them."""
        cfg = adapter.config
        targets = lora_targets(self.model, cfg)
        leaves = ("lora_a", "lora_b", "m") if cfg.dora else ("lora_a", "lora_b")
        if cfg.dora and (absent := sorted(p for p in targets if p not in adapter.modules)):
            # mlx-lm would still rescale those outputs (m = ||W||, b = 0): not the base's bits.
            raise AdapterError(f"DoRA adapter {adapter.name!r} has no tensors for {absent[0]}")
        out = {}
        for path, tensors in adapter.modules.items():
            where = f"adapter {adapter.name!r} ({adapter.path}): {path}"
            if path not in targets:
                raise AdapterError(f"{where} is not a module the adapter's config targets")
            linear = targets[path]
            if type(linear) not in (nn.Linear, nn.QuantizedLinear):
                raise AdapterError(
                    f"{where} is a {type(linear).__name__}: per-row adapters cover Linear and "
                    "QuantizedLinear layers only (no MoE experts, no embeddings)"
                )
            if missing := [leaf for leaf in leaves if leaf not in tensors]:
                raise AdapterError(f"{where} lacks {', '.join(missing)}")
            in_dims, out_dims = dims(linear)
            a, b = tensors["lora_a"], tensors["lora_b"]
            want = {"lora_a": (in_dims, cfg.rank), "lora_b": (cfg.rank, out_dims), "m": (out_dims,)}
            for leaf, value in tensors.items():
                if tuple(value.shape) != want[leaf]:
                    raise AdapterError(
                        f"{where}.{leaf}: shape {tuple(value.shape)}, the model needs {want[leaf]}"
                    )
            gain = dora_gain(linear, a, b, cfg.scale, tensors["m"]) if cfg.dora else None
            out[path] = (linear, Entry(a, b, cfg.scale, gain))
        return out
