"""q/k/v and gate/up as one matmul each in the batched decode step (opt-in:
`--batched-attention folded+fused`).

On CUDA a few-row projection costs a fixed ~30 µs a call whatever its width (cuBLASLt), and a
Qwen3 step makes 7 per layer; stacking the weights of projections that read the same input
drops 3 of them (H200, docs/performance.md). The stacks replace those weights: each layer then
reads its rows of the stack (`_stacked`), so no memory is added; this mode and a rows+fused lone
row (`--decode-step`, plain_rows.py) share them. On the CPU the stacked matmul gives the same
bits; on CUDA another kernel shape may round otherwise.
"""

import itertools
import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from .row_gemv import GemvMatmul, few_rows, fits, with_gemv
from .rows_step import dense_mlps, held


class Stacked:
    """Linear or QuantizedLinear layers of one kind fed the same input, as one matmul over
    their weights stacked by output row; `__call__` returns each layer's output. `gemv`: a
    batched decode step's rows go through row_gemv.py's batched gemv (unquantized weights)."""

    def __init__(self, linears: list[nn.Module], gemv: bool = False) -> None:
        first = linears[0]
        self.quant = isinstance(first, nn.QuantizedLinear)
        if self.quant:
            self.group_size, self.bits, self.mode = first.group_size, first.bits, first.mode
        self.arrays = _stacked(linears, _keys(first))
        widths = [lin["weight"].shape[0] for lin in linears]
        self.edges = list(itertools.accumulate(widths))[:-1]
        routed = gemv and not self.quant and fits(self.arrays["weight"])  # stackable: one kind
        self.gemv = GemvMatmul(self.arrays["weight"]) if routed else None
        self._wt = self.arrays["weight"].T  # made once: no Transpose node a step (rows_step.py)

    def held(self) -> list[mx.array]:
        """The arrays a step reads (the stacks and the held transpose), to evaluate up front."""
        return [*self.arrays.values(), self._wt]

    def __call__(self, x: mx.array) -> list[mx.array]:
        a = self.arrays
        if self.gemv is not None and self.gemv.takes(x):
            y = self.gemv(x)
            y = y + a["bias"] if "bias" in a else y
        elif self.quant:
            y = mx.quantized_matmul(
                x, a["weight"], scales=a["scales"], biases=a.get("biases"), transpose=True,
                group_size=self.group_size, bits=self.bits, mode=self.mode,
            )  # fmt: skip
            y = y + a["bias"] if "bias" in a else y
        else:  # 2-D rows take the held transpose; 3-D keeps a `.T` a call (the probes' baseline)
            wt = self._wt if x.ndim == 2 else a["weight"].T
            y = x @ wt if "bias" not in a else mx.addmm(a["bias"], x, wt)
        return mx.split(y, self.edges, axis=-1)


# The stacks made per first layer of a group (by id: Modules are dicts, unhashable), with the
# row views the layers were given: the folded+fused batch and a rows+fused lone row
# (plain_rows.py) share them. An entry goes with its layer.
_STACKS: dict[int, tuple[tuple[Any, ...], dict[str, mx.array]]] = {}


def _stacked(linears: list[nn.Module], keys: list[str]) -> dict[str, mx.array]:
    """Each of `keys` of `linears` stacked by output row. The layers then hold row slices of
    the stacks (views: the same values and strides, each starting where the allocator's own
    buffers do, at a multiple of 256 bytes, so the same kernels and bits), so the stacks cost no
    memory beyond a layer's while they are made; where a slice would start elsewhere, the layers
    keep their arrays beside the stacks. Again the same stacks while the layers hold those
    arrays."""
    views = tuple(lin[k] for lin in linears for k in keys)
    key = id(linears[0])
    if (hit := _STACKS.get(key)) is None:
        weakref.finalize(linears[0], _STACKS.pop, key, None)
    else:
        made, arrays = hit
        if len(made) == len(views) and all(r() is a for r, a in zip(made, views, strict=True)):
            return arrays
    arrays = {k: mx.concatenate([lin[k] for lin in linears], axis=0) for k in keys}
    mx.eval(arrays)
    if _aligned(linears, keys):
        start = 0
        for lin in linears:
            rows = lin["weight"].shape[0]
            for k in keys:
                lin[k] = arrays[k][start : start + rows]
            start += rows
        views = tuple(lin[k] for lin in linears for k in keys)
        mx.eval(views)  # slices of evaluated arrays: views of their buffers, no copy
    _STACKS[key] = (tuple(weakref.ref(a) for a in views), arrays)
    return arrays


def _keys(linear: nn.Module) -> list[str]:
    """The arrays a Linear or QuantizedLinear computes with."""
    return [k for k in ("weight", "scales", "biases", "bias") if k in linear]


ALIGN = 256  # bytes: where MLX's allocations start (and so where cuBLASLt may assume they do)


def _aligned(linears: list[nn.Module], keys: list[str]) -> bool:
    """Every layer's slice of every stack would start at a multiple of ALIGN bytes and hold
    its own dtype (a stack of mixed dtypes is promoted)."""
    for k in keys:
        if len({lin[k].dtype for lin in linears}) > 1:
            return False
        start = 0
        for lin in linears:
            if start % ALIGN:
                return False
            start += lin[k].nbytes
    return True


def stackable(linears: list[Any]) -> bool:
    """Layers of one exact kind (Linear, or QuantizedLinear with one quantization), all with or
    all without a bias, so one matmul computes what each would."""
    first = linears[0]
    if type(first) not in (nn.Linear, nn.QuantizedLinear):
        return False
    if any(type(lin) is not type(first) or set(lin) != set(first) for lin in linears):
        return False
    quant = ("group_size", "bits", "mode")
    return all(getattr(lin, k, None) == getattr(first, k, None) for lin in linears for k in quant)


class FusedMLP(nn.Module):
    """Wraps one swiglu MLP: a one-token step of several rows runs gate and up as one matmul;
    anything else goes to the original module, op for op."""

    def __init__(self, inner: nn.Module, gemv: bool = False, gemv_down: bool = False) -> None:
        super().__init__()
        self.inner = with_gemv(inner, "down_proj") if gemv_down else inner
        self._gate_up = Stacked([inner.gate_proj, inner.up_proj], gemv)
        self._down = held(self.inner.down_proj)

    def __call__(self, x: mx.array) -> mx.array:
        if not few_rows(x):
            return self.inner(x)
        gate, up = self._gate_up(x)
        return self.inner.down_proj(swiglu(gate, up))

    def rows(self, x: mx.array) -> mx.array:
        """A batched step's (B, D) rows (rows_step.py): down_proj's transpose held."""
        gate, up = self._gate_up(x)
        return self._down(swiglu(gate, up))


def fused_mlp(mlp: Any, gemv: bool = False, gemv_down: bool = False) -> Any:
    """`mlp` wrapped in FusedMLP where its class and projections allow, else `mlp` itself;
    `gemv` / `gemv_down`: gate/up / down through row_gemv.py in a batched decode step."""
    if type(mlp) not in dense_mlps() or not stackable([mlp.gate_proj, mlp.up_proj]):
        return mlp
    return FusedMLP(mlp, gemv, gemv_down)


def stacked_qkv(attn: Any, gemv: bool = False) -> Stacked | None:
    """One matmul for an attention module's q, k and v projections, or None."""
    parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    return Stacked(parts, gemv) if None not in parts and stackable(parts) else None


def stack_in_place(model: Any) -> int:
    """Stack every layer's q/k/v and gate/up that the fused modes would, before anything holds
    their weights (a held transpose made first would keep the unstacked arrays alive beside
    the stacks). Returns the bytes of stacks kept beside the layers' own arrays, which a memory
    budget must count (0 where every slice starts in place)."""
    extra = 0
    inner = model.get("language_model", model)  # a multimodal model's text side
    for layer in inner.model.layers if "model" in inner else []:
        groups = [[getattr(layer.self_attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]]
        if fused_mlp(layer.mlp) is not layer.mlp:
            groups.append([layer.mlp.gate_proj, layer.mlp.up_proj])
        for g in groups:
            if None in g or not stackable(g):
                continue
            keys = _keys(g[0])
            arrays = _stacked(g, keys)
            if not _aligned(g, keys):
                extra += sum(a.nbytes for a in arrays.values())
    return extra
