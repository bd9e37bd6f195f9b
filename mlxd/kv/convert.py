"""A row's KV conversion, called where mlx-lm calls maybe_quantize_kv_cache (after every model
call: each prefill chunk and each decode step) and when a batched row crosses its start.

`--kv-bits` is mlx-lm's function itself; a kv_config is mlx-optiq's per-layer hook
(`mixed.convert`). `windows=True` goes beyond mlx-lm: sliding-window (rotating) layers become
RotatingQuantizedKVCache, as mlx-optiq converts them, where mlx-lm raises "Quantization NYI".
"""

from collections.abc import Callable
from typing import Any

from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import RotatingKVCache

from . import mixed
from .rotating_quantized import to_quantized_rotating


def convert(
    cache: list[Any],
    start: int,
    group_size: int,
    bits: int | None,
    config: Any = None,
    windows: bool = False,
) -> None:
    """Quantize, in place, the layers of one row's cache list that reached `start`."""
    if config is not None:
        mixed.convert(cache, config, start, windows=windows)
    elif not windows:
        maybe_quantize_kv_cache(cache, start, group_size, bits)
    elif bits is not None:
        # mlx-lm's loop, with the rotating layers converted instead of raising.
        for i, c in enumerate(cache):
            if hasattr(c, "to_quantized") and c.offset >= start:
                if isinstance(c, RotatingKVCache):
                    cache[i] = to_quantized_rotating(c, group_size=group_size, bits=bits)
                else:
                    cache[i] = c.to_quantized(group_size=group_size, bits=bits)


def converter(req: Any) -> Callable[[list[Any]], None]:
    """`fn(cache)` for one request (a GenerationRequest's KV fields)."""
    config, windows = req.kv_config, req.quantize_windows
    if config is not None:
        config = mixed.load(config)

    def quantize(cache: list[Any]) -> None:
        convert(cache, req.quantized_kv_start, req.kv_group_size, req.kv_bits, config, windows)

    return quantize
