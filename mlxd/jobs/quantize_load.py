"""A model loaded for quantization the way mlx-lm's convert loads it: lazily, with its floats
cast to the requested dtype (else the config's torch_dtype), so what is quantized from it has
convert's bits."""

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

# mlx_lm.convert.MODEL_CONVERSION_DTYPES: the dtypes convert casts to (others leave it as is).
CAST_DTYPES = ("float16", "bfloat16", "float32")


def load_for_quantize(path: str, dtype: str | None) -> tuple[nn.Module, Any, dict]:
    """(model, tokenizer, config) as convert has them just before quantize_model."""
    from mlx_lm.utils import load

    model, tokenizer, config = load(
        path,
        return_config=True,
        tokenizer_config={"trust_remote_code": False},
        lazy=True,
        trust_remote_code=False,
    )
    cast_to(model, config, dtype)
    return model, tokenizer, config


def cast_to(model: nn.Module, config: dict, dtype: str | None) -> None:
    """convert's cast: floats the model's cast_predicate allows go to the dtype."""
    if dtype is None:
        dtype = config.get("torch_dtype", None)
    if dtype is None and (text_config := config.get("text_config", None)):
        dtype = text_config.get("dtype", None)
    if dtype not in CAST_DTYPES:
        return
    target = getattr(mx, dtype)
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)

    def set_dtype(k: str, v: mx.array) -> mx.array:
        if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(target)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))
