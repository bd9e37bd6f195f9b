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

from mlx_lm.models.cache import make_prompt_cache


def unsupported(model: Any, kv_config: Any, max_kv_size: int | None = None) -> str | None:
    """Why a kv_config cannot run on this model (None when it can): it names a layer that
    holds state rather than keys and values. Uniform --kv-bits never is refused: such layers
    keep their format (as mlx-lm skips them) and rotating layers become quantized rings."""
    if kv_config is None:
        return None
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    for e in kv_config:
        layer = cache[e.layer] if e.layer < len(cache) else None
        if layer is not None and not hasattr(layer, "to_quantized"):
            return (
                f"kv_config layer {e.layer} ({e.bits}-bit) cannot apply: the layer is a "
                f"{type(layer).__name__}, state that is not keys and values"
            )
    return None
