"""Rows changing path: the serial row joining a batch, and a batch's last row leaving it.

Adopt, don't recompute: the caches move (merged into the batch, or extracted without padding),
with the pending token, the token history the logits processors see, and the row's PRNG key.
"""

from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from ..model.folded_attention import is_folded
from .batch import BatchedRows
from .batch_row import BatchedRow
from .handle import RequestHandle
from .output import RowOutput
from .rng import KeyOwner, current_key
from .serial import SerialRow

Serial = tuple[SerialRow, RequestHandle, RowOutput]


def serial_into_batch(serial: Serial, keys: KeyOwner) -> tuple[BatchedRow, list, list, list] | None:
    """The serial row as a batch joiner: (row, tokens to feed, caches, tokens in cache).
    A decoding row first emits its pending token; None if that token ended it."""
    row, handle, out = serial
    feed, in_cache, logprobs = row.handoff()
    moved = BatchedRow(row.req, handle, out, generated=list(row.emitted), plan=row.plan)
    moved.processors = row.processors  # its own (a sibling's twin), or the request's
    moved.cuts = list(row.cuts)  # snapshot points its prefill has not reached yet
    if logprobs is not None:
        in_cache = in_cache + row.emitted
        moved.generated.append(feed[0])
        event, reason = out.token(feed[0], logprobs)
        handle.put(event)
        if reason is not None:
            done = out.done(reason)
            done.random_key = keys.leave(row)
            handle.put(done)
            return None
    key = keys.leave(row)
    moved.key = key if row.req.random_key is not None else None
    return moved, feed, row.cache, in_cache


def drain_keeps_bits(attention: str) -> bool:
    """Whether a batch's last row may return to serial caches and keep BatchGenerator's bits.
    The serial step attends unmasked (MLX's fused kernel); the batch masks. On the CPU both are
    the same formula. MLX-CUDA has no fused masked kernel, so there the row would leave mlx-lm's
    bits (H200: same tokens, other logprobs) and stays in its batch. Folded attention is opt-in
    and already changes bits on CUDA, so it keeps the faster serial step."""
    return is_folded(attention) or not mx.cuda.is_available()


def last_row_out(batch: BatchedRows, model: Any, keys: KeyOwner) -> Serial | None:
    """The batch's only row back on plain serial caches, or None if it cannot leave yet."""
    lone = batch.lone_row()
    if lone is None:
        return None
    brow, cache, pending = lone
    req = brow.req
    history = req.prompt.tolist() + brow.generated
    row = SerialRow.resume(model, req, generation_stream, cache, pending, history, brow.generated,
                           brow.processors)  # fmt: skip
    row.plan = brow.plan  # its cache still goes to the prefix store when it ends
    batch.remove(brow)
    if (key := brow.current_key()) is not None:
        keys.adopt(row, key)
    elif req.random_key is not None:
        keys.adopt(row, current_key())  # it drew from the thread's key: continue from there
    return row, brow.handle, brow.out
