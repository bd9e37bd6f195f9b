"""Per-layer quantization sensitivity, measured: for each layer mlx-lm would quantize, the KL
divergence of the model's next-token distributions with that one layer's weight rounded to a
lower width (quantized and dequantized) from the unquantized model's, on calibration tokens.
The same measurement as optiq's per-layer KL, one layer at a time and one pass per width."""

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def quantizable(model: nn.Module, group_size: int) -> list[tuple[str, nn.Module]]:
    """The layers quantize_model gives our predicate a say over, in model order: those it can
    quantize at `group_size`, less those whose width the model class fixes itself (a MoE
    router kept at 8 bits, say)."""
    fixed = getattr(model, "quant_predicate", None)
    found = []
    leaves = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    for path, module in leaves:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            continue
        if fixed is not None and fixed(path, module) is not True:
            continue  # False (kept as is) or the class's own parameters
        found.append((path, module))
    return found


def _log_probs(model: nn.Module, tokens: mx.array) -> mx.array:
    logits = model(tokens).astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _kl(ref: mx.array, other: mx.array) -> float:
    """Mean over positions of KL(ref || other), both log-probabilities."""
    kl = (mx.exp(ref) * (ref - other)).sum(axis=-1).mean()
    return float(kl.item())


def _rounded(weight: mx.array, group_size: int, bits: int) -> mx.array:
    """`weight` after a round trip through affine quantization at `bits`."""
    q, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits, mode="affine")
    return mx.dequantize(q, scales, biases, group_size=group_size, bits=bits, mode="affine")


def measure(
    model: nn.Module,
    tokens: mx.array,
    group_size: int,
    widths: tuple[int, ...],
    step: Callable[[int, int], None] | None = None,
) -> dict[str, dict[int, float]]:
    """{layer path: {width: KL}} for every width in `widths`. `step(done, total)` is called
    after each forward pass; it may raise to stop."""
    ref = _log_probs(model, tokens)
    mx.eval(ref)
    layers = quantizable(model, group_size)
    total, done = len(layers) * len(widths), 0
    result: dict[str, dict[int, float]] = {}
    for path, module in layers:
        original = module.weight
        result[path] = {}
        try:
            for bits in widths:
                module.weight = _rounded(original, group_size, bits)
                result[path][bits] = _kl(ref, _log_probs(model, tokens))
                done += 1
                if step is not None:
                    step(done, total)
        finally:
            module.weight = original
    return result
