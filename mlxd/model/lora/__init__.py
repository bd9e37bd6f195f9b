"""Many LoRA / DoRA adapters over one base model, rows with different adapters (or none) in
one batched forward: AdapterSlots loads them, the engine sets each row's slot before a call."""

from .adapter import Adapter, AdapterConfig, AdapterError, read_adapter
from .install import install, uninstall
from .layer import MultiLoRALinear
from .rows import SlotRows
from .slots import AdapterSlots

__all__ = [
    "Adapter",
    "AdapterConfig",
    "AdapterError",
    "AdapterSlots",
    "MultiLoRALinear",
    "SlotRows",
    "install",
    "read_adapter",
    "uninstall",
]
