"""Swap a loaded model's target linears for MultiLoRALinear wrappers, and back, by replacing
modules on the model instance (`update_modules`): mlx-lm's classes are left untouched."""

from collections.abc import Mapping

import mlx.nn as nn
from mlx.utils import tree_unflatten

from .layer import MultiLoRALinear
from .rows import SlotRows
from .stack import TargetStack


def install(model: nn.Module, stacks: Mapping[str, TargetStack], rows: SlotRows) -> list[str]:
    """Wrap every linear of `stacks` (full module path -> its stack) not wrapped yet; returns
    the paths wrapped now. A wrapper with no resident adapter gives its base output."""
    modules = dict(model.named_modules())
    new = []
    for path, stack in stacks.items():
        module = modules[path]
        if getattr(module, "multi_lora", False):
            continue
        if type(module) not in (nn.Linear, nn.QuantizedLinear):
            raise TypeError(f"{path}: {type(module).__name__} is not a Linear to wrap")
        new.append((path, MultiLoRALinear(module, stack, rows)))
    if new:
        model.update_modules(tree_unflatten(new))
    return [path for path, _ in new]


def uninstall(model: nn.Module) -> list[str]:
    """Put every wrapped linear back; returns the paths unwrapped."""
    back = [(p, m.linear) for p, m in model.named_modules() if isinstance(m, MultiLoRALinear)]
    if back:
        model.update_modules(tree_unflatten(back))
    return [path for path, _ in back]
