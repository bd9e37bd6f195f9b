"""Apply token bitmasks to a batch of logits on the device.

A bitmask row is ceil(V_tok / 32) int32 words, bit i of word w allowing token 32*w + i (the
layout xgrammar and llguidance share). The model's logits may be wider than the tokenizer
(Qwen3: 151,936 logits for 151,669 ids): ids past the mask are disallowed. Rows that are not
constrained keep their logits bit for bit, padded ids included, so constrained and
unconstrained rows share one batch and one call.
"""

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


def allocate(batch: int, vocab: int) -> np.ndarray:
    """A [batch, ceil(vocab/32)] int32 bitmask, every token allowed."""
    return np.full((batch, (vocab + 31) // 32), -1, dtype=np.int32)


def allowed(bitmask: np.ndarray | mx.array, width: int) -> mx.array:
    """[B, width] bool: the bits of `bitmask` unpacked on the device, False past its words."""
    words = mx.array(bitmask).view(mx.uint32)  # mx.array copies, so the buffer can be refilled
    # Made per call, in the calling thread's stream (an array made at import belongs to the
    # importing thread's stream, which the engine thread cannot evaluate).
    shifts = mx.arange(32, dtype=mx.uint32)
    bits = ((words[:, :, None] >> shifts) & 1).astype(mx.bool_)
    bits = bits.reshape(words.shape[0], -1)
    if bits.shape[1] >= width:
        return bits[:, :width]
    return mx.pad(bits, [(0, 0), (0, width - bits.shape[1])], constant_values=False)


def apply_bitmask(
    logits: mx.array, bitmask: np.ndarray | mx.array, rows: Sequence[int] | None = None
) -> mx.array:
    """`logits` [B, V] with disallowed tokens set to -inf.

    bitmask: [B, W] int32, row i for logits row i. rows: the constrained rows; the others are
    returned unchanged (their bitmask rows are ignored). None: every row is constrained.
    """
    ok = allowed(bitmask, logits.shape[-1])
    if rows is not None:
        keep = np.ones(logits.shape[0], dtype=np.bool_)
        keep[list(rows)] = False
        ok = ok | mx.array(keep)[:, None]
    return mx.where(ok, logits, mx.array(-float("inf"), dtype=logits.dtype))
