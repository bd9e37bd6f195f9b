"""The masks of one batched decode step, filled off the engine thread.

Rows are listed in batch order: a `Matcher` for a constrained row, None for a free one.
`submit` fills every constrained row's mask on a worker thread (llguidance fills rows in
parallel on its own pool and releases the GIL), so the engine can enqueue the next forward
and `mx.async_eval` it while the masks are computed; `apply` then masks the logits:

    fut = masker.submit(rows)                 # right after accept() of the sampled tokens
    logits = model(tokens, cache)[:, -1]      # enqueue the forward; it runs meanwhile
    logits = masker.apply(logits, fut.result(), rows)
"""

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance as llg
import mlx.core as mx
import numpy as np

from .mask import apply_bitmask
from .matcher import Matcher


class BatchMasker:
    """Bitmasks for batches of up to any size over one tokenizer of `vocab` ids."""

    def __init__(self, vocab: int, threads: int | None = None) -> None:
        self.vocab = vocab
        self.words = (vocab + 31) // 32
        self._executor = llg.LLExecutor(threads)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mlxd-grammar")
        # Two buffers, so a step can fill one while the previous mask is still being copied.
        self._buffers: list[np.ndarray] = []
        self._turn = 0

    def _buffer(self, batch: int) -> np.ndarray:
        self._turn ^= 1
        while len(self._buffers) < 2:
            self._buffers.append(np.empty((0, self.words), dtype=np.int32))
        if self._buffers[self._turn].shape[0] < batch:
            self._buffers[self._turn] = np.empty((batch, self.words), dtype=np.int32)
        return self._buffers[self._turn][:batch]

    def fill(self, rows: Sequence[Matcher | None]) -> np.ndarray:
        """The [len(rows), W] bitmask of the next step (free rows: all ones)."""
        out = self._buffer(len(rows))
        out.fill(-1)
        live = [(m, i) for i, m in enumerate(rows) if m is not None]
        if len(live) == 1:
            live[0][0].fill(out[live[0][1]])
        elif live:
            pairs = [(m.inner, i) for m, i in live]
            self._executor.unsafe_compute_mask_ptr(
                pairs, out.ctypes.data, self.words * 4, len(rows)
            )
            for m, i in live:
                out[i, -1] &= m.tail_mask
        return out

    def submit(self, rows: Sequence[Matcher | None]) -> "Future[np.ndarray]":
        """`fill` on the worker thread."""
        return self._thread.submit(self.fill, list(rows))

    @staticmethod
    def apply(logits: mx.array, bitmask: np.ndarray, rows: Sequence[Matcher | None]) -> mx.array:
        """Mask the constrained rows of `logits`; free rows are left bit for bit."""
        constrained = [i for i, m in enumerate(rows) if m is not None]
        if not constrained:
            return logits
        return apply_bitmask(
            logits, bitmask, None if len(constrained) == len(rows) else constrained
        )

    def close(self) -> None:
        self._thread.shutdown(wait=False)
