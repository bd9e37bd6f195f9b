"""A verify step's later positions with the drafting rows' logits processors, position by position.

Position j of a row predicts the token after its draft d_(j-1), so its processors see the history
the plain step would have had there: penalties read the row's token history plus d_0 .. d_(j-1),
and the grammar's matcher has consumed those drafts (each checked against the mask before it:
a forbidden draft stops the row's consumption, and the target, sampling under that mask, can
never accept it). Each position is processed with the plain step's own [B, vocab] ops (bias
scatter, batched penalties, bitmask), so a drafting row's logits are the plain step's bits.
After acceptance `settle` takes back what the matcher consumed past the accepted drafts and
gives the penalty history the accepted ones.
"""

from typing import Any

import mlx.core as mx

from ...constrain.mask import apply_bitmask
from ..penalties import apply_penalties
from ..sampling import LogitBias, Penalty

# Processors a drafting row may hold (a caller's own callable keeps the row plain).
DRAFTABLE = (LogitBias, Penalty)


def draftable(processors: list[Any] | None) -> bool:
    from ...constrain.processor import GrammarLogitsProcessor

    return all(isinstance(p, DRAFTABLE + (GrammarLogitsProcessor,)) for p in processors or ())


def later(
    batch: Any, kinds: list[tuple], drafts: list[list[int]], logits: mx.array
) -> tuple[mx.array, list[int]]:
    """`logits` (B, K, vocab) of positions 1..K processed, and the drafts each grammar row's
    matcher consumed."""
    width = logits.shape[1]
    biases = [k[0] for k in kinds]
    penalties = [k[1] if drafts[e] else [] for e, k in enumerate(kinds)]
    grammars = [k[2] if drafts[e] else None for e, k in enumerate(kinds)]
    bases = {e: batch._token_context[e].state[: batch._token_context[e]._size]
             for e, p in enumerate(penalties) if p}  # fmt: skip
    consumed = [0] * len(drafts)
    masks = _first_masks(batch, grammars)
    out = []
    for j in range(width):
        step = logits[:, j, :]
        if any(biases):
            rows, cols, values = batch._scatter(biases)
            step = step.at[rows, cols].add(values)
        if bases:
            contexts = {e: _context(base, drafts[e][: j + 1]) for e, base in bases.items()}
            step = apply_penalties(step, penalties, contexts)
        if masks is not None:
            live = _consume(grammars, drafts, j, masks, consumed)
            if live:
                masks = batch._masker.fill([g.matcher if e in live else None
                                            for e, g in enumerate(grammars)])  # fmt: skip
                step = apply_bitmask(step, masks, sorted(live))
            else:
                masks = None
        out.append(step)
    return mx.stack(out, axis=1), consumed


def _first_masks(batch: Any, grammars: list[Any]) -> Any:
    """Position 0's masks, as the plain step filled them (the drafts are checked against them)."""
    if not any(grammars):
        return None
    return batch._last_masks


def _consume(grammars, drafts, j, masks, consumed) -> set[int]:
    """Feed each live grammar row its draft d_j if the mask before it allows it."""
    live = set()
    for e, g in enumerate(grammars):
        if g is None or consumed[e] != j or j >= len(drafts[e]):
            continue
        token = drafts[e][j]
        if not (int(masks[e, token >> 5]) >> (token & 31)) & 1:
            continue  # forbidden: the target cannot accept it, nor anything after it
        if g.matcher.accept(token):
            consumed[e] += 1
            live.add(e)
    return live


def _context(base: mx.array, drafts: list[int]) -> mx.array:
    return mx.concatenate([base, mx.array(drafts, dtype=base.dtype)]) if drafts else base


def settle(batch: Any, kinds: list[tuple], drafts: list[list[int]], consumed, accepted) -> None:
    """The matchers back to the accepted drafts; the penalty history gets them."""
    for e, k in enumerate(kinds):
        if not drafts[e] or k is None:
            continue
        a = accepted[e]
        grammar = k[2]
        if grammar is not None:
            grammar.matcher.rollback(consumed[e] - a)
            grammar._seen = (grammar._seen or 0) + a
        if k[1] and a:
            batch._token_context[e].update_and_fetch(mx.array(drafts[e][:a], dtype=mx.int32))
