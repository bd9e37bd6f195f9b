"""Rows changing path: the serial row joining a batch, a batch's last row leaving it, rows whose
KV turns quantized crossing batches, and prompts prefilled alone beside the batch (prefill jobs).

Adopt, don't recompute: the caches move (merged into the batch, or extracted without padding),
with the pending token, the token history the logits processors see, and the row's PRNG key.
"""

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from ..kv.batch_quantized import is_quantized
from ..kv.convert import converter
from ..model.folded_attention import is_folded
from ..model.vision.model import VisionModel
from .batch import BatchedRows
from .batch_row import BatchedRow
from .output import RowOutput
from .prefix import Plan
from .request import DoneEvent, GenerationRequest, RequestHandle, TokenEvent
from .rng import KeyOwner, current_key
from .sampling import seed_key
from .serial import SerialRow
from .speculate.drafting import drafts_in_batch

Serial = tuple[SerialRow, RequestHandle, RowOutput]


def serial_into_batch(
    serial: Serial, keys: KeyOwner
) -> tuple[tuple[BatchedRow, list, list, list] | None, int]:
    """The serial row as a batch joiner: (row, tokens to feed, caches, tokens in cache), and
    the tokens it emitted here (a decoding row first emits its pending token; the joiner is
    None if that token ended it)."""
    row, handle, out = serial
    feed, in_cache, logprobs = row.handoff()
    moved = BatchedRow(row.req, handle, out, generated=list(row.emitted), plan=row.plan)
    moved.processors = row.processors  # its own (a sibling's twin), or the request's
    moved.cuts = list(row.cuts)  # snapshot points its prefill has not reached yet
    moved.model_state = VisionModel.row_state(row.cache)  # its mrope delta, where it has one
    if logprobs is not None:
        in_cache = in_cache + row.emitted
        moved.generated.append(feed[0])
        event, reason = out.token(feed[0], logprobs)
        handle.put(event)
        if reason is not None:
            done = out.done(reason)
            done.random_key = keys.leave(row)
            handle.put(done)
            return None, 1
    key = keys.leave(row)
    moved.key = key if row.req.random_key is not None else None
    return (moved, feed, row.cache, in_cache), int(logprobs is not None)


def drain_keeps_bits(attention: str) -> bool:
    """Whether a batch's last row may return to serial caches and keep BatchGenerator's bits.
    The serial step attends unmasked (MLX's fused kernel); the batch masks. On the CPU both are
    the same formula. MLX-CUDA has no fused masked kernel, so there the row would leave mlx-lm's
    bits (H200: same tokens, other logprobs) and stays in its batch. Folded attention is opt-in
    and already changes bits on CUDA, so it keeps the faster serial step."""
    return is_folded(attention) or not mx.cuda.is_available()


def drafting_gave_up(batch: BatchedRows) -> bool:
    """The batch's rows draft, and its gate has not found drafting worth a step for a while."""
    drafting = batch.decode.drafting
    return drafting is not None and drafting.gave_up()


def last_row_out(batch: BatchedRows, model: Any, keys: KeyOwner) -> Serial | None:
    """The batch's only row back on plain serial caches, or None if it cannot leave yet. A
    drafting row leaves only once drafting stopped paying (the serial step does not draft)."""
    if any(drafts_in_batch(r.req) for r in batch.rows.values()) and not drafting_gave_up(batch):
        return None  # it drafts in the batched step, alone or not
    lone = batch.lone_row()
    if lone is None:
        return None
    brow, cache, pending = lone
    req = brow.req
    history = req.prompt.tolist() + brow.generated
    row = SerialRow.resume(model, req, generation_stream, cache, pending, history, brow.generated,
                           brow.processors)  # fmt: skip
    row.plan = brow.plan  # its cache still goes to the prefix store when it ends
    if isinstance(model, VisionModel):
        model.resume(cache, brow.model_state)  # its own mrope delta again, on its caches
    batch.remove(brow)
    if (key := brow.current_key()) is not None:
        keys.adopt(row, key)
    elif req.random_key is not None:
        keys.adopt(row, current_key())  # it drew from the thread's key: continue from there
    return row, brow.handle, brow.out


# Rows whose KV turns quantized move from the unquantized batch to a quantized one.
#
# mlx-lm converts a row's caches (maybe_quantize_kv_cache) after the model call at which its
# offset reaches `quantized_kv_start`, and feeds the next token through the quantized caches. A
# batched layer cannot be half bf16, half quantized, so at that point the row leaves its batch:
# its caches are extracted without padding, converted by mlx-lm's own function (the solo op on the
# solo values), and it rejoins a batch of its format feeding its pending token. A prompt that
# reaches the start during prefill is prefilled alone instead (`needs_own_prefill`), so the
# conversion lands after the same prefill chunk as in mlx-lm.

Joiner = tuple[BatchedRow, list[int], list[Any], list[int]]  # row, feed, cache, tokens in cache
Event = tuple[RequestHandle, TokenEvent | DoneEvent]


def quantizes(req: GenerationRequest) -> bool:
    return req.kv_bits is not None or req.kv_config is not None


def needs_own_prefill(req: GenerationRequest, plan: Plan | None) -> bool:
    """A row with input embeddings (the batch's prefill feeds token ids), and a quantizing row
    whose prefill converts its caches (mlx-lm checks after each prefill chunk; the prefill
    covers all but the last prompt token) or runs on quantized caches."""
    if req.input_embeddings is not None:
        return True
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


# A prompt prefilled alone, a chunk per engine turn, beside the batch: `n` > 1 (several rows from
# one prompt, prefilled once), quantized-KV rows whose prefill converts their caches, and rows
# with input embeddings (a vision model's images).
#
# The prompt (all but its last token) is prefilled on one serial cache, as generate_step does;
# then the cache is copied for each sibling and all of them join the batch, each feeding the last
# prompt token with its own sampler stream. A row with embeddings also takes its first step
# alone (its last prompt position is an embedding too) and joins decoding, as a serial row does.


class ForkJob:
    def __init__(
        self, model: Any, req: GenerationRequest, handles: list[RequestHandle], stream: Any,
        tokenizer: Any | None, plan: Plan | None = None, snapshot: Any = None,
        outs: list[RowOutput] | None = None, row: SerialRow | None = None,
    ) -> None:  # fmt: skip
        """`row`: continue a serial row's prefill (it is still prefilling) instead of a new one."""
        self.req, self.handles, self.plan = req, handles, plan
        self.row = row if row is not None else SerialRow(model, req, stream, plan, snapshot)
        self.outs = outs or [RowOutput(req, tokenizer, h.submitted) for h in handles]

    @property
    def embeds(self) -> bool:
        return self.req.input_embeddings is not None

    @property
    def ready(self) -> bool:
        """True once only the last prompt token is left (the point where rows diverge); with
        embeddings, once the first token is sampled."""
        if self.embeds:
            return not self.row.prefilling
        return self.row.total - self.row.processed <= 1

    @property
    def samples_next(self) -> bool:
        """Its next step samples the row's first token (with embeddings: here, alone)."""
        return self.embeds and self.row.total - self.row.processed <= 1

    def joiner(self, keys: KeyOwner) -> tuple[Joiner | None, int]:
        """The prefilled row with embeddings as a batch joiner, as serial_into_batch."""
        return serial_into_batch((self.row, self.handles[0], self.outs[0]), keys)

    def step(self) -> None:
        self.row.prefill_chunk()

    def rows(self) -> tuple[list[BatchedRow], list[list[int]], list[list[Any]], list[list[int]]]:
        """The siblings as batch joiners: rows, tokens to feed, caches, tokens in cache."""
        prompt = self.req.prompt.tolist()
        live = list(zip(self.handles, self.outs, strict=True))
        rows, caches = [], []
        for i, (handle, out) in enumerate(live):
            key = self.req.random_key
            if self.req.seed is not None:
                key = seed_key(self.req.seed + i)  # choice i: the stream of seed + i
            row = BatchedRow(self.req, handle, out, key=key, plan=self.plan)
            if i > 0:  # a processor that holds state (a grammar) gets a twin per sibling
                procs = self.req.logits_processors or []
                row.processors = [p.fork() if hasattr(p, "fork") else p for p in procs]
            rows.append(row)
            caches.append(self.row.cache if i == 0 else copy.deepcopy(self.row.cache))
        n = len(rows)
        return rows, [prompt[-1:]] * n, caches, [prompt[:-1] for _ in range(n)]

    def drop_cancelled(self) -> list[tuple[RequestHandle, RowOutput]]:
        """Siblings cancelled while the prompt was prefilling (removed from the job)."""
        pairs = list(zip(self.handles, self.outs, strict=True))
        self.handles = [h for h, _ in pairs if not h.cancelled]
        self.outs = [o for h, o in pairs if not h.cancelled]
        return [(h, o) for h, o in pairs if h.cancelled]
