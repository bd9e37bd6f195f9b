"""Turn one GGUF tensor into MLX arrays: repack Q4_0/Q4_1/Q8_0 as MLX affine triples, dequantize
everything else with `gguf.quants`, undo llama.cpp's q/k row permutation and Gemma's `1 + w` norms.
"""

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import _type_traits, dequantize

from .reader import GGUFFile, TensorInfo

GROUP_SIZE = 32  # the block size of every type we keep packed
# Types MLX's affine quantization represents exactly (w = scale * q + bias, 32 per group).
PACKED_BITS = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q8_0: 8}
FLOAT_TYPES = {Q.F32, Q.F16}  # gguf.quants handles these outside its per-type table


def is_supported(ggml_type: int) -> bool:
    """Whether we can convert this type: packed as-is, or dequantized by the gguf package."""
    try:
        qtype = Q(ggml_type)
    except ValueError:
        return False
    if qtype in FLOAT_TYPES or qtype in PACKED_BITS:
        return True
    traits = _type_traits.get(qtype)
    # Types whose dequantize_blocks is the abstract stub raise NotImplementedError at runtime.
    return traits is not None and "dequantize_blocks" in traits.__dict__


@dataclass(frozen=True)
class Transform:
    """What a tensor needs beyond its storage format."""

    unpermute_heads: int = 0  # >0: undo llama.cpp's rope row permutation for this many heads
    norm_shift: float = 0.0  # Gemma: llama.cpp stored 1 + w; subtract this


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows only, so it applies to packed weights and scales."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte `start` of each block, as float32 (exact)."""
    return blocks[..., start : start + 2].copy().view(np.float16).astype(np.float32)[..., 0]


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values (rows, cols) of `bits` bits → MLX's packing: LSB-first within little-endian uint32."""
    q = q.astype(np.uint8)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(q).view(np.uint32)


def repack(raw: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF blocks (rows, bytes) → (packed uint32, scales f32, biases f32), bit-exact values."""
    rows = raw.shape[0]
    blocks = np.asarray(raw).reshape(rows, -1, {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34}[qtype])
    d = _f16(blocks, 0)
    if qtype == Q.Q8_0:
        # int8 q → uint8 q + 128; w = d * q = d * (q + 128) - 128 d
        q = blocks[..., 2:].view(np.int8).astype(np.int16) + 128
        bias = -128.0 * d
    else:
        qs = blocks[..., -16:]  # byte i holds element i (low nibble) and i + 16 (high nibble)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        bias = _f16(blocks, 2) if qtype == Q.Q4_1 else -8.0 * d
    bits = PACKED_BITS[qtype]
    return _pack(q.reshape(rows, -1), bits), d, bias


def _to_mx(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    return mx.array(np.ascontiguousarray(a)).astype(dtype)


def convert_tensor(
    gf: GGUFFile, info: TensorInfo, dtype: mx.Dtype, transform: Transform
) -> tuple[dict[str, mx.array], int]:
    """`({"weight": ..., ["scales", "biases"]}, bits)`; bits is 0 for a plain float tensor."""
    qtype = Q(info.ggml_type)
    raw = gf.raw(info)
    # Keep a packed type packed unless a value transform (the norm shift) must touch it.
    if qtype in PACKED_BITS and len(info.shape) == 2 and not transform.norm_shift:
        parts = repack(raw, qtype)
        if transform.unpermute_heads:
            parts = tuple(unpermute_rows(p, transform.unpermute_heads) for p in parts)
        w, scales, biases = parts
        out = {"weight": mx.array(w), "scales": _to_mx(scales, dtype)}
        out["biases"] = _to_mx(biases, dtype)
        return out, PACKED_BITS[qtype]
    values = dequantize(np.asarray(raw), qtype).reshape(info.shape)
    if transform.unpermute_heads:
        values = unpermute_rows(values, transform.unpermute_heads)
    if transform.norm_shift:
        values = values.astype(np.float32) - np.float32(transform.norm_shift)
    return {"weight": _to_mx(values, dtype)}, 0
