"""Which modules of a model an adapter adapts: mlx-lm's `linear_to_lora_layers` rules (the last
`num_layers` blocks; `keys` relative to a block, or every linear / embedding of a block; then
top-level modules whose full name is a key), over the model with any wrapper seen as its base."""

import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from .adapter import AdapterConfig

# The module types mlx-lm converts when `keys` is unset (besides modules with a `to_lora` hook).
CONVERTIBLE = (
    nn.Linear,
    nn.QuantizedLinear,
    SwitchLinear,
    QuantizedSwitchLinear,
    nn.Embedding,
    nn.QuantizedEmbedding,
)


def unwrapped(module: nn.Module) -> nn.Module:
    """The base module under a MultiLoRALinear (which keeps it as `.linear`), else `module`."""
    return module.linear if getattr(module, "multi_lora", False) else module


def base_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of `root`'s modules, a wrapper standing as its base (its inside unlisted)."""
    modules = root.named_modules()
    wrappers = [p for p, m in modules if getattr(m, "multi_lora", False)]
    return [
        (path, unwrapped(module))
        for path, module in modules
        if not any(path.startswith(f"{w}.") or (not w and path) for w in wrappers)
    ]


def _is_convertible(module: nn.Module) -> bool:
    return hasattr(module, "to_lora") or isinstance(module, CONVERTIBLE)


def lora_targets(model: nn.Module, config: AdapterConfig) -> dict[str, nn.Module]:
    """Full module path -> base module, for every module mlx-lm would convert for `config`."""
    names = {id(m): p for p, m in model.named_modules()}
    blocks = list(model.layers)
    keys = set(config.keys) if config.keys is not None else None
    if keys is None:
        keys = {p for b in blocks for p, m in base_modules(b) if p and _is_convertible(m)}
    targets: dict[str, nn.Module] = {}
    # `layers[-max(n, 0):]` as mlx-lm slices it: 0 (or less) means every block.
    for block in blocks[-max(config.num_layers, 0) :]:
        prefix = names[id(block)] + "."
        for path, module in base_modules(block):
            if path in keys:
                targets[prefix + path] = module
    for path, module in base_modules(model):
        if path in keys:
            targets[path] = module
    return targets
