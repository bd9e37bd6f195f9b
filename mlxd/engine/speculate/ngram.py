"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of a row's tail.

For each n in `SIZES` the index maps a hash of every n-gram to where its latest occurrence's
next token sits. A lookup tries the longest n first (a long match is specific: a line repeated
in a file is told apart by the text before it) and checks the tokens behind a hash before it
trusts it. A row's prompt is indexed in one pass of numpy (thousands of tokens in about a
millisecond, on the engine thread while other rows wait); its output one token at a time.
"""

from collections.abc import Sequence

import numpy as np

SIZES = (8, 5, 3, 2)  # n-gram lengths tried, longest first
BACK = 32  # tokens of context a caller keeps beyond the longest n-gram (drafting.TAIL)
_P = 1_000_003  # the hash's base: h = sum(t_j * P^(n-1-j)) mod 2^64, tokens shifted by 2
_MASK = (1 << 64) - 1


def _hash(tokens: Sequence[int]) -> int:
    h = 0
    for t in tokens:
        h = (h * _P + t + 2) & _MASK
    return h


def _hashes(seq: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window seq[i : i + n] (uint64 arithmetic wraps mod 2^64)."""
    count = len(seq) - n + 1
    h = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * np.uint64(_P) + seq[j : j + count]
    return h


class NgramIndex:
    """The n-grams of `tokens` (a corpus that may grow), looked up by another sequence's tail."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = list(tokens)
        self.ends: dict[int, dict[int, int]] = {n: {} for n in SIZES}
        seq = np.asarray(self.tokens, dtype=np.int64) + 2
        seq = seq.astype(np.uint64)
        for n in SIZES:
            if len(seq) > n:  # windows followed by a token: those ending before the last
                hashes = _hashes(seq[:-1], n).tolist()
                self.ends[n].update(zip(hashes, range(n, len(seq)), strict=True))

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; each n-gram is indexed once a token follows it (so the corpus's own
        tail never matches itself)."""
        seq = self.tokens
        for t in tokens:
            at = len(seq)
            for n in SIZES:
                if at >= n:
                    self.ends[n][_hash(seq[at - n : at])] = at
            seq.append(t)

    def propose(self, tail: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier match of `tail`'s end ([] if none)."""
        if k <= 0:
            return []
        seq = self.tokens
        for n in SIZES:
            if len(tail) < n:
                continue
            key = list(tail[-n:])
            at = self.ends[n].get(_hash(key))
            if at is not None and seq[at - n : at] == key:
                return seq[at : at + k]
        return []
