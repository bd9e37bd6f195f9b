"""Bits per layer for a target bits-per-weight: a greedy knapsack over measured sensitivity.
Every layer starts at the lowest candidate width; the step with the largest KL reduction per
extra byte is taken next while the model stays within the target, until none fits."""

import heapq
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_reduce


def model_bytes(model: nn.Module) -> int:
    """The bytes of every array in the model, as mlx_lm.utils.compute_bits_per_weight counts."""
    return tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc, model, 0)


def choose_bits(
    kl: dict[str, dict[int, float]],
    sizes: dict[str, int],
    widths: tuple[int, ...],
    base_bytes: int,
    params: int,
    target_bpw: float,
) -> dict[str, int]:
    """{layer: width}. `kl[layer][w]`: the measured KL at width w (the widest counts as 0);
    `sizes[layer]`: its weight count; `base_bytes`: the model's bytes with every layer at the
    lowest width; `params`: the model's weight count (fixed by the source model)."""
    budget = target_bpw * params / 8 - base_bytes
    if budget < 0:
        low_bpw = base_bytes * 8 / params
        raise ValueError(f"target_bpw {target_bpw} is below {widths[0]}-bit's {low_bpw:.4f}")
    order = {path: i for i, path in enumerate(kl)}
    level = {path: 0 for path in kl}

    def loss(path: str, k: int) -> float:
        return 0.0 if k == len(widths) - 1 else kl[path][widths[k]]

    def push(heap: list, path: str) -> None:
        k = level[path]
        if k + 1 < len(widths):
            cost = sizes[path] * (widths[k + 1] - widths[k]) // 8
            gain = loss(path, k) - loss(path, k + 1)
            heapq.heappush(heap, (-gain / cost, order[path], path, cost))

    heap: list = []
    for path in kl:
        push(heap, path)
    used = 0
    while heap:
        _, _, path, cost = heapq.heappop(heap)
        # The budget only shrinks, so a step that does not fit now never will: drop it.
        if (base_bytes + used + cost) * 8 > target_bpw * params:
            continue
        used += cost
        level[path] += 1
        push(heap, path)
    return {path: widths[k] for path, k in level.items()}


def plan_predicate(
    model: nn.Module, bits: dict[str, int], group_size: int, default_bits: int
) -> Callable[[str, nn.Module], bool | dict]:
    """mlx-lm's quant_predicate protocol: the model class's own choices first (quantize_model
    uses ours instead of the class's), then the planned width of each layer."""
    fixed = getattr(model, "quant_predicate", None)

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if fixed is not None and (own := fixed(path, module)) is not True:
            return own
        return {"group_size": group_size, "bits": bits.get(path, default_bits), "mode": "affine"}

    return predicate
