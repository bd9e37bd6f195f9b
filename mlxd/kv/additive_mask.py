"""A batched prefill's padding mask, handed to MLX-CUDA's cuDNN attention as the additive mask
MLX would make of it, without MLX's copy over every query head.

mlx-lm's BatchKVCache masks a padded prefill with a boolean (B, 1, L, S) array. MLX-CUDA's
fused attention takes no boolean mask: `mx.fast.scaled_dot_product_attention` broadcasts it to
(B, query heads, L, S) and converts it with `where(mask, full_like(0), full_like(-inf))`, which
writes two fills and the select at full size in every layer (a 0.6B join of 32 rows x 332 new
tokens over 3.9k: 1.4 GB each, ~0.24 s of a 0.33 s prefill on an H100, docs/performance.md).
Given the same 0 / -inf values in the attention's dtype, MLX only broadcasts it (a view): the
kernel adds the same bias, so the bits are the same (tests/kv/test_additive_mask.py; on the
device, cuda_tests.sh). Only where MLX itself would convert: elsewhere a boolean mask takes
MLX's `where(mask, scores, finfo.min)`, which an additive -inf mask is not.
"""

import math
from functools import cache
from typing import Any

import mlx.core as mx

from ..config import cudnn_attention

# Model types whose attention hands the cache's mask straight to mlx-lm's
# `scaled_dot_product_attention` (others read it as a boolean: gemma2, phi3small, ...).
MODEL_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen2", "qwen2_moe", "llama", "gemma3_text"})


def takes_additive(model: Any) -> bool:
    """Whether `model`'s attention takes an additive mask as it takes the boolean one."""
    kind = getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )
    return kind in MODEL_TYPES


@cache
def _cuda_capability() -> int:
    if not mx.cuda.is_available():
        return 0
    info = mx.device_info()
    return int(info.get("compute_capability_major", 0))


def _on_cuda_gpu() -> bool:
    """The default device is an MLX-CUDA GPU that cuDNN's attention runs on (Ampere on)."""
    return mx.default_device() == mx.gpu and _cuda_capability() >= 8


def fused_prefill(dtype: mx.Dtype, k_dim: int, v_dim: int) -> bool:
    """Whether MLX-CUDA runs a prefill (several queries a row) under an array mask through cuDNN,
    converting a boolean mask to an additive one: `supports_sdpa_cudnn` in MLX 0.32's
    backend/cuda/scaled_dot_product_attention.cpp."""
    if not _on_cuda_gpu():
        return False
    if not cudnn_attention():
        return False
    if dtype not in (mx.float16, mx.bfloat16):
        return False
    return all(d % 8 == 0 and d <= 128 for d in (k_dim, v_dim))


def additive(mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """The boolean mask as MLX-CUDA converts it: 0 where True, -inf where False, in `dtype`."""
    return mx.where(mask, mx.array(0, dtype), mx.array(-math.inf, dtype))
