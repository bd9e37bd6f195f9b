"""Repetition, presence and frequency penalties over a whole batch, kind by kind (the batched
step's, decode_step.py, and a verify step's later positions, speculate/processed.py)."""

from typing import Any

import mlx.core as mx

from .sampling import Penalty

# mlx-lm's GenerationBatch applies each row's processors to its one-row slice, then concatenates
# the rows. Each penalty only reads and writes the logits of the row's last `context` tokens, so
# gathering every row's (row, token) pairs of one kind and running the penalty's ops on them once
# does the same ops to the same logits, in the same order per logit (bias, repetition, presence,
# frequency, as make_logits_processors orders them): the same bits
# (tests/engine/test_batch_penalties.py).

KINDS = ("repetition", "presence", "frequency")


def apply_penalties(
    logits: mx.array, penalties: list[list[Penalty]], contexts: dict[int, mx.array]
) -> mx.array:
    """`penalties[e]`: row e's penalties; `contexts[e]`: its token history including the token
    this step feeds (mlx-lm's TokenBuffer.update_and_fetch)."""
    for kind in KINDS:
        items = [(e, p) for e, ps in enumerate(penalties) for p in ps if p.kind == kind]
        if not items:
            continue
        windows = [contexts[e][-p.context :] for e, p in items]  # mlx-lm's tokens[-context:]
        sizes = [w.shape[0] for w in windows]
        rows = mx.array([e for (e, _), n in zip(items, sizes, strict=True) for _ in range(n)])
        cols = windows[0] if len(windows) == 1 else mx.concatenate(windows)
        values = [p.penalty for (_, p), n in zip(items, sizes, strict=True) for _ in range(n)]
        logits = _apply(kind, logits, rows, cols, mx.array(values, dtype=logits.dtype))
    return logits


def _apply(kind: str, logits: mx.array, rows: Any, cols: Any, p: mx.array) -> mx.array:
    """The ops of mlx-lm's make_*_penalty processors, on (row, token) pairs."""
    if kind == "repetition":
        selected = logits[rows, cols]
        logits[rows, cols] = mx.where(selected < 0, selected * p, selected / p)
    elif kind == "presence":
        logits[rows, cols] = logits[rows, cols] - p
    else:
        logits = logits.at[rows, cols].subtract(p)
    return logits
