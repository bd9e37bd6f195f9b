"""Guards against NaN adapters: a loss that survives a batch with no target tokens, and a check
that every tensor of the saved adapter is finite before the job may succeed."""

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .report import JobError


def guarded_loss(model: Any, batch: mx.array, lengths: mx.array) -> tuple[mx.array, mx.array]:
    """mlx-lm's default_loss with the divisor at least 1: a batch whose targets are all masked
    (prompt masking + truncation) gives 0 instead of 0/0 = NaN, which would poison every LoRA
    factor through Adam. Whenever the batch has targets the value is default_loss's, bit for bit.
    """
    inputs = batch[:, :-1]
    targets = batch[:, 1:]

    logits = model(inputs)

    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])

    ce = nn.losses.cross_entropy(logits, targets) * mask
    ntoks = mask.sum()
    ce = ce.astype(mx.float32).sum() / mx.maximum(ntoks, 1)

    return ce, ntoks


def target_count(batch: mx.array, lengths: mx.array) -> int:
    """The tokens the loss trains on in this batch (the loss mask's sum), from the batch shape
    alone, so the job can count them without touching the compiled step."""
    width = batch.shape[1] - 1  # the loss's targets are positions 1..width
    lens = np.array(lengths, dtype=np.int64)
    first = np.maximum(lens[:, 0], 1)
    last = np.minimum(lens[:, 1], width)
    return int(np.maximum(last - first + 1, 0).sum())


def check_finite_adapter(path: Path) -> None:
    """JobError("nonfinite_adapter") unless every tensor in the adapter file is finite."""
    weights = mx.load(str(path))
    bad = [name for name, w in sorted(weights.items()) if not mx.all(mx.isfinite(w)).item()]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise JobError(
            "nonfinite_adapter",
            f"the trained adapter has NaN or infinite values in {bad[0]}{more}; "
            "try a lower learning rate",
        )
