"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of a row's tail.

The index maps every n-gram (n in `sizes`) of a token sequence to where its next token sits,
keeping the last few occurrences. A lookup tries the longest n first and, among its
occurrences, takes the one whose preceding tokens agree longest with the tail (optiq's rule:
a line repeated in a file is followed by different text at each place), the latest on a tie.
"""

from collections.abc import Sequence

SIZES = (8, 5, 3, 2)  # n-gram lengths tried, longest first
KEEP = 4  # occurrences kept per n-gram (the latest ones)
BACK = 32  # tokens compared before a match to rank its occurrences


class NgramIndex:
    """The n-grams of `tokens` (a corpus that may grow), looked up by another sequence's tail."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; each n-gram is indexed once a token follows it (so the corpus's own
        tail never matches itself)."""
        seq, ends = self.tokens, self.ends
        for t in tokens:
            at = len(seq)
            for n in SIZES:
                if at >= n:
                    places = ends.setdefault(tuple(seq[at - n : at]), [])
                    places.append(at)
                    if len(places) > KEEP:
                        del places[0]
            seq.append(t)

    def propose(self, tail: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the best earlier match of `tail`'s end ([] if none)."""
        if k <= 0:
            return []
        seq = self.tokens
        for n in SIZES:
            if len(tail) < n:
                continue
            places = self.ends.get(tuple(tail[-n:]))
            if not places:
                continue
            best, agree = places[-1], -1
            for at in reversed(places):
                m = _agreement(seq, at - n, tail, len(tail) - n)
                if m > agree:
                    best, agree = at, m
            return seq[best : best + k]
        return []


def _agreement(seq: list[int], i: int, tail: Sequence[int], j: int) -> int:
    """How many tokens before seq[i] and tail[j] are equal, up to BACK."""
    m = 0
    while m < BACK and i > m and j > m and seq[i - m - 1] == tail[j - m - 1]:
        m += 1
    return m
