"""Which KV scheme a model's cache layers can take, checked before any work runs.

mlx-lm quantizes a row's caches in the middle of generation (maybe_quantize_kv_cache), and a
sliding-window (rotating) layer then raises "RotatingKVCache Quantization NYI" mid-request.
The Python API keeps that behaviour (same exception after the same tokens, as mlx-lm); the
server refuses such a request before any work (400) and refuses to start when every request
would fail, naming the layer. Layers that hold state rather than keys and values (recurrent /
SSM) keep their own format, as in mlx-lm, which skips them.
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


def unsupported(model: Any, kv_bits: int | None, max_kv_size: int | None = None) -> str | None:
    """Why `kv_bits` cannot run on this model's cache layers (None when it can)."""
    if kv_bits is None:
        return None
    for name, layer in _layers(make_prompt_cache(model, max_kv_size=max_kv_size)):
        if isinstance(layer, RotatingKVCache):
            source = "--max-kv-size" if max_kv_size is not None else "the model's sliding window"
            return (
                f"KV quantization (kv_bits={kv_bits}) cannot apply to cache layer {name}: it is "
                f"a rotating cache (window {layer.max_size}, from {source}), which has no "
                "quantized form yet"
            )
    return None


def reaches_quantization(
    prompt_tokens: int, max_tokens: int, quantized_kv_start: int, cached: int = 0
) -> bool:
    """mlx-lm converts once a cache's offset reaches `quantized_kv_start`; the last generated
    token is never fed, so a row reaches at most cached + prompt + max_tokens - 1 positions."""
    return max_tokens < 0 or cached + prompt_tokens + max_tokens - 1 >= quantized_kv_start
