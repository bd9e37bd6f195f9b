"""A grammar as an mlx-lm logits processor, for B=1 generation (`generate_step`,
`stream_generate`, or a row of mlx-lm's BatchGenerator): `processor(tokens, logits)`.

mlx-lm calls it with the row's whole history, the prompt first; the first call's `tokens`
are the prompt, and every later call has the previously sampled token appended. The
processor feeds those new tokens to its matcher and masks the logits. It starts the step's
forward (`mx.async_eval`) before it fills the mask on the CPU, so the two overlap.
"""

from typing import Any

import mlx.core as mx
import numpy as np

from .mask import apply_bitmask
from .matcher import Matcher


class GrammarLogitsProcessor:
    """Masks a row's logits to its grammar. One instance per generation (it holds state)."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self._seen: int | None = None  # tokens of the history already consumed
        self._mask = np.empty((1, (matcher.vocab + 31) // 32), dtype=np.int32)

    def __call__(self, tokens: Any, logits: mx.array) -> mx.array:
        n = len(tokens)
        if self._seen is None:
            self._seen = n  # the prompt: nothing generated yet
        elif n > self._seen:
            new = tokens[self._seen :]
            new = new.tolist() if isinstance(new, mx.array) else list(new)
            self._seen = n
            if not self.matcher.accept_many(new):
                raise ValueError(f"a sampled token broke the grammar: {self.matcher.error}")
        mx.async_eval(logits)  # the device computes this step's forward while the mask fills
        self.matcher.fill(self._mask[0])
        return apply_bitmask(logits, self._mask)

    def fork(self) -> "GrammarLogitsProcessor":
        """A twin with its own matcher in this one's state (a sibling sampled from one prompt)."""
        twin = GrammarLogitsProcessor(self.matcher.copy())
        twin._seen = self._seen
        return twin

    def advance(self, token: int) -> None:
        """The batched step's path (engine/decode_step.py): one sampled token fed, the history
        one longer, as the next call here would have seen it."""
        self._seen = (self._seen or 0) + 1
        if not self.matcher.accept(token):
            raise ValueError(f"a sampled token broke the grammar: {self.matcher.error}")


def make_processor(tokenizer: Any, constraint: Any) -> GrammarLogitsProcessor:
    """A processor for `constraint` (a Constraint) over `tokenizer`, compiled through the
    shared per-tokenizer compiler."""
    from .compiler import compiler_for

    return GrammarLogitsProcessor(compiler_for(tokenizer).matcher(constraint))
