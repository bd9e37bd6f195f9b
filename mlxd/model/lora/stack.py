"""The resident adapters of one target linear, stacked by slot for one gathered matmul a row.

Slot 0 ("no adapter") and every slot whose adapter leaves this linear alone hold zeros with
scale 0: their rows get `y + 0`, the base output's bits. Ranks are zero-padded to the largest
resident one; a padded column adds exact zeros to each sum, so a row's delta keeps the bits of
its own unpadded `(x @ a) @ b` (checked against mlx-lm in tests/model/test_multi_lora.py).
"""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .adapter import AdapterError


def dims(linear: nn.Module) -> tuple[int, int]:
    """(input, output) dims of a Linear or QuantizedLinear, recovered as mlx-lm's from_base does."""
    output_dims, input_dims = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        input_dims = input_dims * 32 // linear.bits
    return input_dims, output_dims


def dense_weight(linear: nn.Module) -> mx.array:
    """The weight as DoRALinear computes with it: dequantized when the base is quantized."""
    if not isinstance(linear, nn.QuantizedLinear):
        return linear.weight
    return mx.dequantize(
        linear.weight,
        linear.scales,
        linear.biases,
        group_size=linear.group_size,
        bits=linear.bits,
        mode=linear.mode,
    )


@dataclass(frozen=True)
class Entry:
    """One adapter on this linear: its own arrays, as mlx-lm's LoRALinear / DoRALinear hold them.
    `gain` (DoRA): m / ||W + scale * b.T @ a.T||, what DoRALinear recomputes on every call."""

    a: mx.array
    b: mx.array
    scale: float
    gain: mx.array | None = None


def dora_gain(linear: nn.Module, a: mx.array, b: mx.array, scale: float, m: mx.array) -> mx.array:
    """DoRALinear.__call__'s `m / denom`, with its op order (a pure function of the weights)."""
    adapted = dense_weight(linear) + (scale * b.T) @ a.T
    return m / mx.linalg.norm(adapted, axis=1)


def _dtypes(e: Entry) -> tuple:
    """(a, b[, gain]) dtypes: a gain's only meets another gain's."""
    return (e.a.dtype, e.b.dtype) + (() if e.gain is None else (e.gain.dtype,))


class TargetStack:
    """Slot-stacked arrays of one target linear: a [S, in, r], b [S, r, out], scale [S], and for
    DoRA gain [S, out] and is_dora [S]. Rebuilt between steps, never during one."""

    def __init__(self, path: str, linear: nn.Module) -> None:
        self.path = path
        self.in_dims, self.out_dims = dims(linear)
        self.entries: dict[int, Entry] = {}
        self.capacity = 0
        self.a = self.b = self.scale = self.gain = self.is_dora = None
        self.has_dora = False

    def put(self, slot: int, entry: Entry) -> None:
        """Set `slot`'s adapter; every slot of a stack shares the dtypes of a, b (and gain)."""
        for other in self.entries.values():
            mine, theirs = _dtypes(entry), _dtypes(other)
            if len(mine) == len(theirs) and mine != theirs or mine[:2] != theirs[:2]:
                raise AdapterError(
                    f"{self.path}: adapter dtypes {mine} differ from the resident adapters' "
                    f"{theirs}; one stack would change their bits"
                )
        self.entries[slot] = entry

    def drop(self, slot: int) -> None:
        self.entries.pop(slot, None)

    def rebuild(self, capacity: int) -> None:
        """Restack the entries over slots 0..capacity-1 (ids of rows index these arrays)."""
        self.capacity = capacity
        if not self.entries:
            self.a = self.b = self.scale = self.gain = self.is_dora = None
            self.has_dora = False
            return
        first = next(iter(self.entries.values()))
        rank = max(e.a.shape[1] for e in self.entries.values())
        a_rows, b_rows, scales, gains, flags = [], [], [], [], []
        for slot in range(capacity):
            e = self.entries.get(slot)
            if e is None:
                a_rows.append(mx.zeros((self.in_dims, rank), first.a.dtype))
                b_rows.append(mx.zeros((rank, self.out_dims), first.b.dtype))
            else:
                pad = rank - e.a.shape[1]
                a_rows.append(mx.pad(e.a, [(0, 0), (0, pad)]) if pad else e.a)
                b_rows.append(mx.pad(e.b, [(0, pad), (0, 0)]) if pad else e.b)
            scales.append(0.0 if e is None else e.scale)
            flags.append(e is not None and e.gain is not None)
            gains.append(e.gain if flags[-1] else None)
        self.a, self.b = mx.stack(a_rows), mx.stack(b_rows)
        self.scale = mx.array(scales, dtype=mx.float32)
        self.is_dora = mx.array(flags)
        self.has_dora = any(flags)
        self.gain = None
        if any(flags):
            like = next(g for g in gains if g is not None)
            self.gain = mx.stack([mx.ones_like(like) if g is None else g for g in gains])
        mx.eval([x for x in (self.a, self.b, self.scale, self.is_dora, self.gain) if x is not None])

    def nbytes_of(self, slot: int) -> int:
        """What `slot` holds here: its own arrays plus its padded rows of the stacks."""
        e = self.entries.get(slot)
        if e is None:
            return 0
        own = e.a.nbytes + e.b.nbytes + (e.gain.nbytes if e.gain is not None else 0)
        stacked = (self.a.nbytes + self.b.nbytes) // max(self.capacity, 1)
        return own + stacked
