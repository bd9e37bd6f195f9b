"""Batched prefill: how many joiners prefill together (a wave), and a prompt batch that keeps
MLX's buffer cache: mlx-lm's PromptProcessingBatch.prompt, step for
step, without its `mx.clear_cache()` after every chunk and after the padded rows' roll.

On CUDA a clear hands every cached buffer back to the driver: 0.13-0.14 s per call for 32 rows
of an 8B model on the H200 (docs/performance.md, the join's parts), paid while every running row
waits, and the next steps allocate again. The arrays, and so the bits, are the same; the cache
holds the prefill's buffers for reuse instead (MLX's cache limit still applies).

A wave whose rows all finish prefilling together moves to decoding as it is (`split`): mlx-lm
deep-copies the batch's caches and gathers every row out of them, two copies of the whole cache
(for 32 rows of an 8B model at 4k tokens, ~19 GB each) that hold the same values.
"""

from typing import Any

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch, _right_pad_prompts

from . import instrument as parts
from .adapters import no_slots


class SlottedPromptBatch(PromptProcessingBatch):
    """mlx-lm's prompt processing with each row's adapter slot set around its chunks
    (engine/adapters.py; by uid, in the batch's row order). Its copies keep the setter."""

    adapter_rows = staticmethod(no_slots)

    def prompt(self, tokens: list[list[int]]) -> None:
        with self.adapter_rows(list(self.uids)):
            self._prompt(tokens)

    def _prompt(self, tokens: list[list[int]]) -> None:
        super().prompt(tokens)

    def generate(self, tokens: list[list[int]]) -> Any:
        """mlx-lm's generate: the prompt's rest, then its GenerationBatch's first step."""
        if any(len(t) > 1 for t in tokens):
            self.prompt([t[:-1] for t in tokens])
            tokens = [t[-1:] for t in tokens]
        with self.adapter_rows(list(self.uids)):
            return super().generate(tokens)

    def _copy(self) -> "SlottedPromptBatch":
        new = super()._copy()
        new.adapter_rows = self.adapter_rows
        return new


class KeptBuffersPromptBatch(SlottedPromptBatch):
    """mlx-lm's prompt processing without the buffer-cache clears (same arrays)."""

    def generate(self, tokens: list[list[int]]) -> Any:
        tic = parts.start()
        out = super().generate(tokens)
        if tic is not None:  # traced: mlx-lm 0.32's GenerationBatch holds the first tokens
            parts.stop("first_step", tic, getattr(out, "_next_tokens", None))
        return out

    def _prompt(self, tokens: list[list[int]]) -> None:
        if len(self.uids) != len(tokens):
            raise ValueError("The batch length doesn't match the number of inputs")
        if not tokens:
            return
        for kept, new in zip(self.tokens, tokens, strict=True):
            kept += new  # the tokens the cache holds, as mlx-lm keeps them
        lengths = [len(p) for p in tokens]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        padded = max(padding) > 0
        if padded:
            inputs = _right_pad_prompts(tokens, max_length=longest)
            for c in self.prompt_cache:
                c.prepare(lengths=lengths, right_padding=padding)
        else:
            inputs = mx.array(tokens)
        if (tic := parts.start()) is not None:  # traced: the merge of the joiners' caches
            parts.stop("merge", tic, [c.state for c in self.prompt_cache])
            parts.note("shape", [len(tokens), longest, getattr(self.prompt_cache[0], "_idx", -1)])
        while inputs.shape[1] > 0:
            n = min(self.prefill_step_size, inputs.shape[1])
            tic = parts.start()
            self.model(inputs[:, :n], cache=self.prompt_cache)
            self._eval_caches()
            parts.stop("forward", tic)
            inputs = inputs[:, n:]
        if padded:
            tic = parts.start()
            for c in self.prompt_cache:
                c.finalize()
            self._eval_caches()
            parts.stop("roll", tic)

    def split(self, indices: list[int]) -> "KeptBuffersPromptBatch":
        """mlx-lm's split; when every row leaves (a wave done prefilling), the rows move to the
        new batch as they are, instead of a deep copy and a gather of the whole cache."""
        indices = sorted(indices)
        if indices != list(range(len(self.uids))):
            tic = parts.start()
            out = super().split(indices)
            if tic is not None:  # traced: mlx-lm's deep copy and gathers of the whole cache
                parts.stop("split", tic, [c.state for c in out.prompt_cache])
            return out
        moved = self.__class__.__new__(self.__class__)
        moved.__dict__.update(self.__dict__)
        for c in moved.prompt_cache:
            c.filter(indices)  # mlx-lm's filter of the kept rows (a no-op gather for ours)
        self.uids, self.prompt_cache, self.tokens, self.samplers = [], [], [], []
        self.logits_processors, self.max_tokens, self.stop_sequences = [], [], []
        return moved

    def _eval_caches(self) -> None:
        mx.eval([c.state for c in self.prompt_cache])


def keep_buffers(gen: Any, cls: type = KeptBuffersPromptBatch) -> None:
    """Give a fresh BatchGenerator this prompt batch (its split and copy keep the class)."""
    old = gen._prompt_batch
    gen._prompt_batch = cls.empty(
        old.model, old.fallback_sampler, prefill_step_size=old.prefill_step_size
    )


def clears_cache(mode: str) -> bool:
    """`--prefill-clear-cache`: on, off, or auto (off on CUDA, where a clear is slow; on
    elsewhere, mlx-lm's behaviour)."""
    if mode == "auto":
        return not mx.cuda.is_available()
    return mode == "on"


# How many joiners prefill together. mlx-lm takes a fixed count (`prefill_batch_size`,
# mlx_lm.server's `--prompt-concurrency`, 8); with a token budget, more rows join the wave while
# rows x the longest next chunk (padding counted) stays within it.
#
# Agents that come back together with short new turns then prefill in one wave instead of one per
# 8 rows: each wave costs a join (merge, padded prefill, roll, first step) however few tokens it
# carries. Rows prefilled together get BatchGenerator's bits at that composition.
#
# A wave about to move to decoding whole moves before new rows join the prompt batch: joining
# first makes the move mlx-lm's partial split, a deep copy and a gather of every row's cache.


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
    the whole prompt batch to decoding as it is (prefill.py's split), unless rows join it
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
