"""How many joiners prefill together. mlx-lm takes a fixed count (`prefill_batch_size`,
mlx_lm.server's `--prompt-concurrency`, 8); with a token budget, more rows join the wave while
rows x the longest next chunk (padding counted) stays within it.

Agents that come back together with short new turns then prefill in one wave instead of one
per 8 rows: each wave costs a join (merge, padded prefill, roll, first step) however few tokens
it carries. Rows prefilled together get BatchGenerator's bits at that composition.

A wave about to move to decoding whole moves before new rows join the prompt batch: joining
first makes the move mlx-lm's partial split, a deep copy and a gather of every row's cache.
"""

from typing import Any


def wave_rows(gen: Any, floor: int, budget: int) -> int:
    """Rows BatchGenerator's prompt batch may hold this step: `floor` (mlx-lm's count), or more
    while rows x the longest next chunk stays within `budget` tokens. Reads mlx-lm 0.32's queue
    (`_currently_processing`: [segments, done, total]; `_unprocessed_sequences`: segments at 1)."""
    step = gen.prefill_step_size
    chunks = [min(len(seq[0][0]), step) for seq in gen._currently_processing if seq[0]]
    rows, longest = len(gen._currently_processing), max(chunks, default=0)
    for seq in gen._unprocessed_sequences:
        n = min(len(seq[1][0]), step)
        if (rows + 1) * max(longest, n) > budget:
            break
        rows, longest = rows + 1, max(longest, n)
    return max(floor, rows)


def moving_whole(gen: Any) -> bool:
    """Every row BatchGenerator is prefilling has only its last token left, so this step moves
    the whole prompt batch to decoding as it is (batch_prompt.py's split), unless rows join it
    first. mlx-lm 0.32's `_currently_processing` entries are [segments, done, total]."""
    rows = gen._currently_processing
    return bool(rows) and all(len(s[0]) == 1 and len(s[0][0]) == 1 for s in rows)


def wave_size(gen: Any, floor: int, budget: int | None) -> int:
    """BatchGenerator's `prefill_batch_size` for this step: the prompt batch's own rows while it
    moves whole (joiners wait one step: 0.08-0.09 s of a 32-row 0.6B join on the H200 went to
    the partial split, once 4 s), else `wave_rows` under a budget, else mlx-lm's count."""
    if moving_whole(gen):
        return len(gen._currently_processing)
    return floor if budget is None else wave_rows(gen, floor, budget)


def wave_budget(tokens: int, concurrency: int, step: int) -> int | None:
    """`--prefill-batch-tokens`: 0 off (None), -1 auto (mlx-lm's worst case for a wave,
    `concurrency` rows of a full `step` chunk, so peak prefill memory stays where it was)."""
    if tokens == 0:
        return None
    return concurrency * step if tokens < 0 else tokens
