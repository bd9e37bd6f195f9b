"""How many joiners prefill together. mlx-lm takes a fixed count (`prefill_batch_size`,
mlx_lm.server's `--prompt-concurrency`, 8); with a token budget, more rows join the wave while
rows x the longest next chunk (padding counted) stays within it.

Agents that come back together with short new turns then prefill in one wave instead of one
per 8 rows: each wave costs a join (merge, padded prefill, roll, first step) however few tokens
it carries. Rows prefilled together get BatchGenerator's bits at that composition.
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


def wave_budget(tokens: int, concurrency: int, step: int) -> int | None:
    """`--prefill-batch-tokens`: 0 off (None), -1 auto (mlx-lm's worst case for a wave,
    `concurrency` rows of a full `step` chunk, so peak prefill memory stays where it was)."""
    if tokens == 0:
        return None
    return concurrency * step if tokens < 0 else tokens
