"""Which KV scheme a model's cache layers can take, checked before any work runs.

mlx-lm quantizes a row's caches in the middle of generation (maybe_quantize_kv_cache), and a
sliding-window (rotating) layer then raises "RotatingKVCache Quantization NYI" mid-request.
The Python API keeps that behaviour (same exception after the same tokens, as mlx-lm) unless a
request sets `quantize_windows`; the server sets it: such layers become quantized rings
(kv/rotating_quantized.py, mlx-optiq's bits). Layers that hold state rather than keys and
values (recurrent / SSM) keep their own format under --kv-bits, as in mlx-lm, which skips
them; a kv_config that names one asks for something that cannot apply, so the server refuses
it at start-up, naming the layer.
"""

from typing import Any

from mlx_lm.models.cache import CacheList, RotatingKVCache, make_prompt_cache


def _layers(cache: list[Any]) -> list[tuple[str, Any]]:
    out = []
    for i, c in enumerate(cache):
        if isinstance(c, CacheList):
            out += [(f"{i}.{j}", sub) for j, sub in enumerate(c.caches)]
        else:
            out.append((str(i), c))
    return out


def unsupported(
    model: Any,
    kv_bits: int | None,
    max_kv_size: int | None = None,
    kv_config: Any = None,
    windows: bool = False,
) -> str | None:
    """Why the scheme cannot run on this model's cache layers (None when it can). `windows`:
    rotating layers are quantized (otherwise they are what cannot take it, as in mlx-lm)."""
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    if kv_config is not None:
        for e in kv_config:
            layer = cache[e.layer] if e.layer < len(cache) else None
            if layer is not None and not hasattr(layer, "to_quantized"):
                return (
                    f"kv_config layer {e.layer} ({e.bits}-bit) cannot apply: the layer is a "
                    f"{type(layer).__name__}, state that is not keys and values"
                )
    if (kv_bits is None and kv_config is None) or windows:
        return None
    named = {str(e.layer) for e in kv_config} if kv_config is not None else None
    for name, layer in _layers(cache):
        if isinstance(layer, RotatingKVCache) and (named is None or name in named):
            source = "--max-kv-size" if max_kv_size is not None else "the model's sliding window"
            return (
                f"KV quantization cannot apply to cache layer {name}: it is a rotating cache "
                f"(window {layer.max_size}, from {source}), which mlx-lm cannot quantize"
            )
    return None
