"""One row's grammar state: which tokens may come next, and the tokens taken so far.

The engine's order per decode step, for a constrained row:
  1. sample token t from the masked logits; read it back;
  2. `accept(t)` (tens of microseconds; False means t broke the grammar: fail the row);
  3. `fill(row)` writes the next step's mask; it releases the GIL, so it can run on a worker
     thread (see `BatchMasker.submit`) while the device computes the next forward.
Never call `accept` and `fill` on one matcher at the same time.
"""

import llguidance as llg
import numpy as np


class Matcher:
    """A row's matcher (an llguidance LLMatcher) for a tokenizer of `vocab` ids."""

    __slots__ = ("_m", "vocab", "eos", "tail_mask", "_stopped")

    def __init__(self, inner: llg.LLMatcher, vocab: int, eos: frozenset[int]) -> None:
        self._m = inner
        self.vocab = vocab
        self.eos = eos
        # Bits past the tokenizer's last id in the last word must stay 0 (they are padded ids).
        r = vocab % 32
        self.tail_mask = np.int32(-1 if r == 0 else (1 << r) - 1)
        self._stopped = False

    @property
    def inner(self) -> llg.LLMatcher:
        """The llguidance matcher (for `LLExecutor`'s parallel fill)."""
        return self._m

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed next tokens into `row`, a C-contiguous int32 array of
        ceil(vocab / 32) words (bit i of word w = token 32*w + i). EOS is set only where the
        output is complete; an errored matcher allows nothing."""
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        row[-1] &= self.tail_mask

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; False if the grammar forbids it (the matcher is then in
        an error state for good: see `error`)."""
        if self._stopped:  # llguidance errors on EOS once stopped; EOS is all that may follow
            return token in self.eos and not self._m.is_error()
        ok = self._m.consume_token(token)
        self._stopped = self._m.is_stopped()
        return ok

    def accept_many(self, tokens: list[int]) -> bool:
        """`accept` for several tokens (a forced prefix, or accepted draft tokens)."""
        return all(self.accept(t) for t in tokens)

    def is_accepting(self) -> bool:
        """The output so far is complete: EOS may come next."""
        return self._m.is_accepting()

    def is_terminated(self) -> bool:
        """Nothing but EOS can follow (an EOS was accepted, the grammar has no continuation,
        or the matcher errored): the engine may finish the row without another step."""
        return self._stopped

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (rejected draft tokens)."""
        if n and not self._m.rollback(n):
            raise RuntimeError(f"grammar rollback of {n} tokens failed: {self._m.get_error()}")
        self._stopped = self._m.is_stopped()

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a forbidden token, a resource limit), or None."""
        return self._m.get_error() or None if self._m.is_error() else None

    def copy(self) -> "Matcher":
        """An independent matcher in this one's state (`n` > 1 siblings of one prompt)."""
        twin = Matcher(self._m.deep_copy(), self.vocab, self.eos)
        twin._stopped = self._stopped
        return twin

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (jump-forward decoding; may be empty)."""
        return self._m.compute_ff_tokens()
