"""Rows whose KV turns quantized move from the unquantized batch to a quantized one.

mlx-lm converts a row's caches (maybe_quantize_kv_cache) after the model call at which its
offset reaches `quantized_kv_start`, and feeds the next token through the quantized caches.
A batched layer cannot be half bf16, half quantized, so at that point the row leaves its
batch: its caches are extracted without padding, converted by mlx-lm's own function (the
solo op on the solo values), and it rejoins a batch of its format feeding its pending token.
A prompt that reaches the start during prefill is prefilled alone instead (`needs_own_prefill`),
so the conversion lands after the same prefill chunk as in mlx-lm.
"""

from typing import Any

from ..kv.batch_quantized import is_quantized
from ..kv.convert import converter
from .batch import BatchedRows
from .batch_row import BatchedRow
from .handle import RequestHandle
from .prefix import Plan
from .request import DoneEvent, GenerationRequest, TokenEvent

Joiner = tuple[BatchedRow, list[int], list[Any], list[int]]  # row, feed, cache, tokens in cache
Event = tuple[RequestHandle, TokenEvent | DoneEvent]


def quantizes(req: GenerationRequest) -> bool:
    return req.kv_bits is not None or req.kv_config is not None


def needs_own_prefill(req: GenerationRequest, plan: Plan | None) -> bool:
    """A quantizing row whose prefill converts its caches (mlx-lm checks after each prefill
    chunk; the prefill covers all but the last prompt token) or runs on quantized caches."""
    if not quantizes(req):
        return False
    start = plan.start if plan is not None else 0
    cache = plan.cache if plan is not None and plan.cache else req.prompt_cache
    if len(req.prompt) - start <= 1:
        return False
    return is_quantized(cache) or len(req.prompt) - 1 >= req.quantized_kv_start


def crossing(batch: BatchedRows, events: list[Event]) -> list[Joiner]:
    """Take out the rows of an unquantized batch whose caches reached their start: they rejoin
    (as joiners for a quantized batch) after emitting their pending token, or end on it.
    `events`, this turn's, gets theirs; a conversion that raises ends its row with the error
    in place of the token mlx-lm would not have yielded either (it converts before yielding)."""
    gen = batch.gen._generation_batch
    due = []
    for i, uid in enumerate(gen.uids):
        row = batch.rows.get(uid)
        if row is not None and quantizes(row.req):
            if len(gen.tokens[i]) >= row.req.quantized_kv_start:
                due.append((i, row))
    joiners: list[Joiner] = []
    for i, row in due:
        req = row.req
        cache = gen.extract_cache(i)
        try:
            converter(req)(cache)
        except Exception as e:  # noqa: BLE001 - mlx-lm's NYI for rotating layers ends the row
            events[:] = [(h, ev) for h, ev in events if h is not row.handle]
            events.append((row.handle, row.out.done("error", e)))
            continue
        token, logprobs = gen._next_tokens[i].item(), gen._next_logprobs[i]
        history = list(gen.tokens[i])
        moved = BatchedRow(req, row.handle, row.out, generated=[*row.generated, token])
        moved.plan, moved.processors = row.plan, row.processors
        moved.key = row.current_key() if row.keyed is not None else row.key
        event, reason = row.out.token(token, logprobs)
        events.append((row.handle, event))
        if reason is not None:
            events.append((row.handle, row.out.done(reason)))
        else:
            joiners.append((moved, [token], cache, history))
    for _, row in due:
        batch.gen.remove([row.uid])
        batch.rows.pop(row.uid, None)
    return joiners
