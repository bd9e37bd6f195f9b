"""A batch's KV cache whose rows' shared prefix is held once (`--batched-attention folded+shared`).

An agent fleet's rows start with one system prompt (~3.6k tokens). A BatchKVCache holds it once
per row (32 copies at 32 agents) and every decode step reads every copy. Here one (1, H, P, D)
copy holds the prefix and `keys` / `values` hold the rows' own tokens, left-padded as mlx-lm
lays a batch out; `offset` still counts every token of a row (its RoPE position). mlx-lm's
filter / extend / extract / trim work on the own part; a row leaves with the prefix put back.
"""

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

from .batch_roll import RollingBatchKVCache


class SharedPrefixBatchKVCache(RollingBatchKVCache):
    """RollingBatchKVCache over the rows' own tokens, after one shared prefix (see module doc).
    With `prefix_keys` None it is a plain batch (after `materialize`)."""

    prefix_keys: mx.array | None = None  # (1, H, P, D)
    prefix_values: mx.array | None = None
    prefix_tokens: tuple[int, ...] = ()  # the prefix's tokens: one tuple for all layers

    @classmethod
    def split_off(
        cls, plain: BatchKVCache, tokens: tuple[int, ...], like: Any = None
    ) -> "SharedPrefixBatchKVCache":
        """`plain`'s rows, whose first len(tokens) positions hold `tokens`, with that prefix
        held once: `like`'s copy (a layer of the running batch), else row 0's. The own part is
        one slice: every row's own tokens end at the batch's end."""
        P, lp, idx = len(tokens), plain.left_padding.tolist(), plain._idx
        own = [idx - p - P for p in lp]
        if min(own) < 0 or plain._right_padding is not None:
            raise ValueError("a row is shorter than the shared prefix, or still padded right")
        width = max(own)
        out = cls([width - n for n in own])
        out.offset = plain.offset  # unchanged: positions count the prefix
        out._idx = width
        if width:
            out.keys = mx.contiguous(plain.keys[..., idx - width : idx, :])
            out.values = mx.contiguous(plain.values[..., idx - width : idx, :])
        if like is not None:
            out.prefix_keys, out.prefix_values = like.prefix_keys, like.prefix_values
            out.prefix_tokens = like.prefix_tokens
        else:
            out.prefix_keys = mx.contiguous(plain.keys[:1, :, lp[0] : lp[0] + P])
            out.prefix_values = mx.contiguous(plain.values[:1, :, lp[0] : lp[0] + P])
            out.prefix_tokens = tokens
        return out

    def shares(self, other: Any) -> bool:
        """Both hold the same prefix copy (a running batch and a wave split off against it)."""
        return (
            isinstance(other, SharedPrefixBatchKVCache)
            and self.prefix_keys is not None
            and other.prefix_keys is self.prefix_keys
        )

    def materialize(self) -> None:
        """Back to mlx-lm's layout: each row's padding, the prefix, its own tokens."""
        if self.prefix_keys is None:
            return
        P, B = self.prefix_keys.shape[2], self.offset.shape[0]
        pad = self.left_padding.tolist()
        self.keys = _rejoin(self.keys, self.prefix_keys, pad, B)
        self.values = _rejoin(self.values, self.prefix_values, pad, B)
        self._idx += P
        self.prefix_keys = self.prefix_values = None
        self.prefix_tokens = ()

    def extend(self, other: Any) -> None:
        if not self.shares(other):  # a row without this prefix joins: everyone plain
            self.materialize()
            if isinstance(other, SharedPrefixBatchKVCache):
                other.materialize()
        super().extend(other)

    def extract(self, idx: int) -> Any:
        row = super().extract(idx)
        if self.prefix_keys is not None:
            row.keys = mx.concatenate([self.prefix_keys, row.keys], axis=2)
            row.values = mx.concatenate([self.prefix_values, row.values], axis=2)
            row.offset = row.keys.shape[2]
        return row

    @property
    def nbytes(self) -> int:
        held = 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
        if self.prefix_keys is not None:
            held += self.prefix_keys.nbytes + self.prefix_values.nbytes
        return held


def _rejoin(own: mx.array | None, prefix: mx.array, pad: list[int], B: int) -> mx.array:
    rows = []
    for i, p in enumerate(pad):
        parts = [prefix] if own is None else [own[i : i + 1, :, :p], prefix, own[i : i + 1, :, p:]]
        rows.append(mx.concatenate(parts, axis=2))
    return mx.concatenate(rows, axis=0) if B > 1 else rows[0]


def common_prefix(rows: list[list[int]]) -> int:
    """How many leading tokens every row shares."""
    n = min(len(r) for r in rows)
    first = np.asarray(rows[0][:n])
    for r in rows[1:]:
        differ = np.flatnonzero(np.asarray(r[:n]) != first[:n])
        n = int(differ[0]) if differ.size else n
    return n
