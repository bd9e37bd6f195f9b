"""mlx-lm's one-token decode step over 2-D rows: the same kernels, fewer view nodes.

mlx-lm's one-token step (generate_step's, BatchGenerator's in the `mlx` attention mode) passes
(B, 1, D) through each block: each projection is a Flatten, a Transpose of its weight, the
matmul and an Unflatten, and each head split a reshape and a transpose, ~30 views a layer that
launch nothing but cost the host ~0.7-1.3 µs each (docs/performance.md).
A small model's step is host-bound on every backend, so a lone agent, or a batch of them, pays
them every token. Here each block steps on (B, D) rows as rows_step.py's folded step does, with
mlx-lm's own attention call (`scaled_dot_product_attention`, the mask as it came): the same
kernels on the same memory, so the same bits (tests/model/test_plain_rows.py).

`fuse` (`--decode-step rows+fused`): a lone row's q/k/v and gate/up (plain Linears) as one
matmul each. At one row MLX-CUDA runs a matmul as its gemv, one warp's dot over K per output,
whatever the width, so the stacked product is the same bits there (and on the CPU, tested);
the narrow k/v gemvs cost ~18 µs each on an 8B H100 step whatever their 8 MB (performance.md
§1). Two rows or more keep the separate projections, which read their rows of
the stacks: no memory is added (fused_projections.py), and folded+fused shares the stacks.
"""

import copy
import functools
import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import scaled_dot_product_attention

from .fused_projections import Stacked, stack_in_place, stackable, stacked_qkv
from .gemma_rows import GemmaMLP, GemmaRowsStep, gemma_blocks, gemma_mlps
from .phi_rows import PhiMLP, PhiRowsAttention, phi_blocks
from .rows_step import (
    HeldLinear,
    HeldMLP,
    Projections,
    RowsAttention,
    RowsStep,
    blocks,
    dense_mlps,
    heads_rows,
    rows_block,
)


class PlainRowsAttention(RowsAttention):
    """Wraps one layer's attention (separate q, k, v, o projections): a one-token step runs
    over (B, D) rows (`rows`); anything else goes to the original module, op for op."""

    def __init__(self, inner: nn.Module, fuse: bool = False) -> None:
        super().__init__(inner)
        self.proj = Projections(inner)
        self.qkv = stacked_qkv(inner) if fuse and _plain(inner, _QKV) else None

    def rows(self, x: mx.array, mask: Any, cache: Any) -> mx.array:
        """mlx-lm's attention over (B, D) rows (rows_step.heads_rows), its own call after."""
        a, p = self.inner, self.proj
        if self.qkv is not None and x.shape[0] == 1:  # one gemv (the module doc)
            q, k, v = self.qkv(x)
        else:
            q, k, v = p.q(x), p.k(x), p.v(x)
        q, k, v = heads_rows(a, q, k, v, cache)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=a.scale, mask=mask)
        return p.o(out.reshape(x.shape[0], -1))


def supports(model: Any) -> bool:
    """An mlx-lm model as loaded (a Module holding its inner model, which holds its layers; or
    the text side of a multimodal one: qwen2_vl, qwen3_vl, pixtral, mistral3, gemma3), every
    block one whose call is RowsStep's formula (llama, qwen2, qwen3, qwen3_moe), Gemma 3's or
    Phi-3's. A wrapper that forwards attributes (a caller's own counting or scripted model) is
    stepped as it is: a copy would bypass its call."""
    return _path(model) is not None


_PATHS = (("model",), ("language_model", "model"))  # where mlx-lm's models hold their layers


def _path(model: Any) -> tuple[str, ...] | None:
    """The attribute path from `model` to the module holding its layers, read as a dict (a
    Module's children), so forwarded attributes are not followed."""
    for path in _PATHS:
        node = model
        for name in path:
            node = node.get(name) if isinstance(node, nn.Module) else None
        layers = node.get("layers") if isinstance(node, nn.Module) else None
        if layers and all(type(layer) in _known() for layer in layers):
            return path
    return None


class OneRowFusedMLP(HeldMLP):
    """HeldMLP whose lone row runs gate and up as one matmul (the module doc's `fuse`)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__(inner)
        self._gate_up = Stacked([inner.gate_proj, inner.up_proj])

    def rows(self, x: mx.array) -> mx.array:
        if x.shape[0] != 1:
            return super().rows(x)
        gate, up = self._gate_up(x)
        return self._down(swiglu(gate, up))


class PlainRowsTwin:
    """An engine's plain-rows twin of its model: made on first use and again whenever a module
    or weight it holds was replaced since (an adapter fused, the model quantized or updated
    after the engine started), so a held transpose is never stale. The check is ~0.03 ms at 28
    layers, against ~1 ms to make the twin. It holds no reference to the model itself."""

    def __init__(self) -> None:
        self._fused = False  # the twin's plain_rows `fuse`
        self._model: Any = None  # a weak reference to the model the twin was made from
        self._twin: nn.Module | None = None
        self._held: list[tuple[Any, Any, Any]] = []  # (container, None: the model; key; child)

    def of(self, model: nn.Module, fuse: bool = False) -> nn.Module:
        """The twin of `model` (plain_rows' `fuse`: a change of it makes the twin again)."""
        fresh = self._model is not None and self._model() is model and self._fused == fuse
        if not (fresh and all((model if c is None else c)[k] is v for c, k, v in self._held)):
            # the model itself where its blocks are not supported
            self._twin, self._fused = plain_rows(model, fuse), fuse
            self._held = _holdings(model) if self._twin is not model else []
            self._model = weakref.ref(model)
        return self._twin  # type: ignore[return-value]


@functools.cache
def _known() -> tuple[type, ...]:
    return blocks() + gemma_blocks() + phi_blocks()


def _holdings(model: nn.Module) -> list[tuple[Any, Any, Any]]:
    """What `plain_rows(model)` read: the modules down to the layers, the layers, their
    attention and MLP modules, the projections and their weights and biases."""
    found: list[tuple[Any, Any, Any]] = []
    inner = model
    for name in _path(model) or ():  # the model itself as None: the twin must not keep it alive
        found.append((None if inner is model else inner, name, inner[name]))
        inner = inner[name]
    found.append((inner, "layers", inner["layers"]))
    for i, layer in enumerate(inner["layers"]):
        found.append((inner["layers"], i, layer))
        for part, names in (("self_attn", _ATTN), ("mlp", _MLP)):
            module = layer[part]
            found.append((layer, part, module))
            for name in names:
                if name in module:
                    lin = module[name]
                    found.append((module, name, lin))
                    found += [(lin, k, lin[k]) for k in ("weight", "bias") if k in lin]
    return found


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
_MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


def plain_rows(model: nn.Module, fuse: bool = False) -> nn.Module:
    """A shallow copy of `model`, sharing its weights, whose one-token steps run over rows
    (held weight transposes, no head transposes); `model` itself when its blocks are not
    supported. Prefill chunks and anything else run the original modules. `fuse`: a lone row's
    q/k/v and gate/up as one matmul each, in llama-family and Gemma blocks (the module doc)."""
    if (path := _path(model)) is None:
        return model
    if fuse:  # before any held transpose reads those weights (fused_projections.py)
        stack_in_place(model)
    root = shadow = copy.copy(model)
    original = model
    for name in path:  # a copy of each module down to the layers' holder, sharing weights
        setattr(shadow, name, copy.copy(original[name]))
        shadow, original = shadow[name], original[name]
    layers = []
    for layer in original.layers:
        layers.append(_rows_twin(layer, fuse))
    shadow.layers = layers
    # The held transposes are views: evaluated here, on the thread that made them, they launch
    # nothing, and any thread can step the twin (MLX streams are per thread: engine/driver.py).
    stacks = [
        o for t in layers for o in (getattr(t.self_attn, "qkv", None), vars(t.mlp).get("_gate_up"))
    ]
    stacked = [a for st in stacks if isinstance(st, Stacked) for a in st.held()]
    mx.eval([h.wt for h in _held_linears(layers)], stacked)  # the stacks: computed, not views
    return root


def _rows_twin(layer: Any, fuse: bool = False) -> Any:
    """A copy of one block stepping over rows: its attention and MLP wrapped by its family's
    classes, the family's block formula mixed in (Phi-3 loads q/k/v and gate/up stacked)."""
    twin = copy.copy(layer)
    if type(layer) in phi_blocks():
        twin.self_attn, twin.mlp = PhiRowsAttention(layer.self_attn), PhiMLP(layer.mlp)
        return rows_block(twin, RowsStep)
    twin.self_attn = PlainRowsAttention(layer.self_attn, fuse)
    gemma = type(layer) in gemma_blocks()
    if type(layer.mlp) in (gemma_mlps() if gemma else dense_mlps()):
        mlp = layer.mlp
        fused = fuse and not gemma and _plain(mlp, ("gate_proj", "up_proj"))
        twin.mlp = OneRowFusedMLP(mlp) if fused else (GemmaMLP if gemma else HeldMLP)(mlp)
    return rows_block(twin, GemmaRowsStep if gemma else RowsStep)


_QKV = ("q_proj", "k_proj", "v_proj")


def _plain(module: Any, names: tuple[str, ...]) -> bool:
    """Plain Linears only: the argument for the stack's bits is MLX's unquantized gemv."""
    linears = [getattr(module, n, None) for n in names]
    return all(type(lin) is nn.Linear for lin in linears) and stackable(linears)


def _held_linears(layers: list[Any]) -> list[HeldLinear]:
    """Every held transpose of the twin's layers (attention wrappers keep theirs directly or
    in `proj`, MLP wrappers directly)."""
    owners = [o for t in layers for o in (t.self_attn, getattr(t.self_attn, "proj", None), t.mlp)]
    return [
        h for o in owners if o is not None for h in vars(o).values() if isinstance(h, HeldLinear)
    ]
