"""Embeddings: a model's last hidden state (after its final norm, before the LM head), pooled
over each input's tokens and L2-normalized.

Inputs of one call run together in length buckets: inputs of equal length share a forward,
with no padding. Padding would need a mask, and mlx-lm's models take one only through a batch
KV cache, which recurrent and convolutional layers (LFM2, Mamba) cannot use; padded rows also
change the kernels' shapes, so an input's vector would depend on its neighbours. Equal lengths
need only the causal mask each input gets alone.

Every forward runs under the engine's turn lock (engine/driver.py), so no decode step of the
engine runs MLX work while it does."""

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..model.pooling import Pooling

MAX_BATCH_TOKENS = 8192  # tokens of one forward: bounds its activations and how long it holds
# the turn lock, so running rows wait at most one such forward between their steps
PREFILL_STEP = 2048  # mlx-lm's prefill step: a longer input's chunks


def hidden_model(model: Any) -> Any | None:
    """The module of `model` that returns its last hidden state (mlx-lm's inner `model`)."""
    for inner in (getattr(model, "model", None),
                  getattr(getattr(model, "language_model", None), "model", None)):  # fmt: skip
        if inner is not None and callable(inner) and hasattr(inner, "layers"):
            return inner
    return None


def vocab_size(model: Any, tokenizer: Any) -> int:
    """How many token ids the model embeds (its embedding table's rows; else the tokenizer's)."""
    table = getattr(hidden_model(model), "embed_tokens", None)
    weight = getattr(table, "weight", None)
    if isinstance(weight, mx.array):
        return int(weight.shape[0])
    return len(tokenizer.get_vocab())


def buckets(lengths: Sequence[int], max_tokens: int = MAX_BATCH_TOKENS) -> list[list[int]]:
    """Indices of inputs grouped by length, each group at most `max_tokens` tokens (and at
    least one input)."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    groups = []
    for n, indices in sorted(by_length.items()):
        per = max(1, max_tokens // max(n, 1))
        groups += [indices[i : i + per] for i in range(0, len(indices), per)]
    return groups


def pool(hidden: mx.array, pooling: Pooling) -> mx.array:
    """(B, L, D) token states -> (B, D) float32 vectors."""
    if pooling == "cls":
        return hidden[:, 0].astype(mx.float32)
    if pooling == "last":
        return hidden[:, -1].astype(mx.float32)
    return hidden.astype(mx.float32).mean(axis=1)


def normalized(vectors: mx.array, dimensions: int | None = None) -> mx.array:
    """Each row cut to its first `dimensions` values, then scaled to unit L2 norm (OpenAI's
    `dimensions`: a shorter vector of the same model, still normalized)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    norms = mx.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / mx.maximum(norms, 1e-12)


class TooManyDimensions(ValueError):
    """`dimensions` exceeds the model's hidden size."""


def embed(
    model: Any,
    inputs: Sequence[Sequence[int]],
    pooling: Pooling = "mean",
    dimensions: int | None = None,
    lock: AbstractContextManager[Any] | None = None,
) -> list[list[float]]:
    """One unit vector (float32 values) per token list, in order; `lock`: the engine's turn
    lock, held for each forward."""
    inner = hidden_model(model)
    if inner is None:
        raise ValueError("this model exposes no hidden states to embed")
    out: list[list[float]] = [[] for _ in inputs]
    for group in buckets([len(ids) for ids in inputs]):
        tokens = mx.array([list(inputs[i]) for i in group], dtype=mx.int32)
        with lock if lock is not None else contextlib.nullcontext():
            pooled = pool(states(model, inner, tokens), pooling)
            if dimensions is not None and dimensions > pooled.shape[-1]:
                width = pooled.shape[-1]
                raise TooManyDimensions(f"dimensions must be at most {width} (the model's width)")
            vectors = normalized(pooled, dimensions)
            mx.eval(vectors)
        for i, row in zip(group, vectors.tolist(), strict=True):
            out[i] = row
    return out


def states(model: Any, inner: Any, tokens: mx.array) -> mx.array:
    """The token states of a (B, L) batch: one forward, or for an input longer than
    MAX_BATCH_TOKENS, chunks through a KV cache (attention scores of a whole long input at
    once would not fit in memory)."""
    if tokens.shape[1] <= MAX_BATCH_TOKENS:
        return inner(tokens)
    cache = make_prompt_cache(model)
    parts = []
    for at in range(0, tokens.shape[1], PREFILL_STEP):
        parts.append(inner(tokens[:, at : at + PREFILL_STEP], cache=cache))
        mx.eval(parts[-1], [c.state for c in cache])
    return mx.concatenate(parts, axis=1)
