"""A Linear or QuantizedLinear whose batch rows each take their own adapter (or none).

Every row's output has the bits of that row alone through mlx-lm's LoRALinear (or DoRALinear)
with its adapter: `y + (scale * ((x @ a) @ b)).astype(x.dtype)`. A batch whose rows share one
slot runs exactly those ops on the adapter's own arrays; a mixed batch gathers each row's
stacked a and b with `mx.gather_mm` (the fastest exact choice measured on the CPU against a
loop over the adapters present and a rank-concatenated matmul). Slot-0 rows add exact zeros.
Dropout is left out: it is the identity at inference, as after mlx-lm's `model.eval()`.
"""

import mlx.core as mx
import mlx.nn as nn

from .rows import SlotRows
from .stack import Entry, TargetStack, dense_weight


def _lora(linear: nn.Module, x: mx.array, e: Entry) -> mx.array:
    """LoRALinear.__call__ (DoRALinear.__call__ when `e.gain` is set), op for op."""
    if e.gain is None:
        y = linear(x)
        z = (x @ e.a) @ e.b
        return y + (e.scale * z).astype(x.dtype)
    y = x @ dense_weight(linear).T
    z = (x @ e.a) @ e.b
    out = e.gain.astype(x.dtype) * (y + (e.scale * z).astype(x.dtype))
    return out + linear.bias if "bias" in linear else out


def _per_row(x: mx.array, w: mx.array, rows: SlotRows) -> mx.array:
    """x[i] @ w[ids[i]] for every row i. MLX's CPU gather_mm takes float32 only: other dtypes
    there take each row's matrix first (the same bits, measured slower in float32)."""
    if mx.result_type(x, w) != mx.float32 and mx.default_device().type == mx.cpu:
        return x @ w[rows.ids]
    return mx.gather_mm(x, w, lhs_indices=rows.lhs, rhs_indices=rows.ids)


class MultiLoRALinear(nn.Module):
    """Wraps `linear`; `rows` (shared by the model's wrappers) says each row's slot in `stack`."""

    multi_lora = True  # how targets.py tells a wrapper from its base

    def __init__(self, linear: nn.Module, stack: TargetStack, rows: SlotRows) -> None:
        super().__init__()
        self.linear = linear
        # Plain attributes, not module state: the model's parameters stay the base's.
        self.stack = stack
        self.rows = rows

    def __call__(self, x: mx.array) -> mx.array:
        rows, stack = self.rows, self.stack
        if rows.slots is None or not rows.present & stack.entries.keys():
            return self.linear(x)
        if x.shape[0] != len(rows.slots):
            raise ValueError(f"{len(rows.slots)} slot ids set for a batch of {x.shape[0]} rows")
        if rows.uniform is not None:
            return _lora(self.linear, x, stack.entries[rows.uniform])
        shape = x.shape
        x3 = x.reshape(shape[0], -1, shape[-1])  # gather_mm batches over the leading axis
        z = _per_row(_per_row(x3, stack.a, rows), stack.b, rows)
        scale = stack.scale[rows.ids].astype(z.dtype)[:, None, None]
        delta = (scale * z).astype(x.dtype).reshape(*shape[:-1], -1)
        if not stack.has_dora:
            return self.linear(x) + delta
        return self._with_dora(x, delta)

    def _with_dora(self, x: mx.array, delta: mx.array) -> mx.array:
        """DoRA rows take DoRALinear's own product (the dense weight, the gain, the bias last);
        the others the base output plus their delta; `where` picks each row's bits unchanged."""
        rows, stack, linear = self.rows, self.stack, self.linear
        lead = (-1,) + (1,) * (x.ndim - 1)
        gain = stack.gain[rows.ids].astype(x.dtype)
        gain = gain.reshape(gain.shape[0], *(1,) * (x.ndim - 2), gain.shape[-1])
        dora = gain * (x @ dense_weight(linear).T + delta)
        if "bias" in linear:
            dora = dora + linear.bias
        return mx.where(stack.is_dora[rows.ids].reshape(lead), dora, linear(x) + delta)
