"""Rows running together: mlx-lm's BatchGenerator as the batched step (its PromptProcessingBatch
and GenerationBatch, merge / extend / filter / extract caches), driven by the engine's loop.

Rows admitted together get exactly BatchGenerator's tokens at that composition; the engine
decides who joins and when, and maps its responses back to the rows' handles.
"""

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from ..config import EngineConfig
from ..kv.additive_mask import takes_additive
from ..kv.batch_quantized import mergeable
from ..model.folded_attention import for_mode
from ..model.vision.model import VisionModel
from ..store.layers import clone
from . import instrument as parts
from .adapters import uid_slots
from .batch_row import BatchedRow, speculation_of, wants_of
from .culprits import Guarded, guard_processors, guard_sampler
from .decode_step import BiasedGenerationBatch
from .generator import RowsGenerator
from .kernel_window import StepClock
from .overlap import StepEncoder, StepPhases, stream
from .prefill import KeptBuffersPromptBatch, SlottedPromptBatch, keep_buffers, wave_size
from .prefix import PrefixSharing
from .request import DoneEvent, RequestHandle, TokenEvent
from .rng import current_key, repair_key
from .sampling import default_on
from .speculate.drafting import Drafting, drafts_in_batch

log = logging.getLogger("mlxd.engine")


def evaluates_after_step(gen: BatchGenerator) -> bool:
    """mlx-lm 0.32's next() prefills a chunk on the calling thread after its decode step, on
    the same stream, when rows wait or are prefilling."""
    return bool(gen._unprocessed_sequences or len(gen._prompt_batch))


class BatchedRows:
    """The batched rows of one engine (created when a second row joins)."""

    def __init__(
        self,
        model: Any,
        config: EngineConfig,
        sharing: PrefixSharing | None = None,
        fmt: Any = None,
        phases: StepPhases | None = None,
        clock: StepClock | None = None,
    ) -> None:
        self.sharing = sharing
        self.fmt = fmt  # the KV format of every row's caches (None: unquantized)
        self.vision = model if isinstance(model, VisionModel) else None
        model = for_mode(model, config.attention)
        self.gen = RowsGenerator(
            model,
            completion_batch_size=config.completion_batch,
            prefill_batch_size=config.prefill_batch,
            prefill_step_size=config.prefill_step_size,
            max_kv_size=config.max_kv_size,
            stream=stream() if config.step_order == "thread" else None,  # overlap.py
        )
        # mlx-lm's prompt batch (or one keeping its buffers) that sets the rows' adapter slots
        keep_buffers(self.gen, SlottedPromptBatch if config.clear_cache else KeptBuffersPromptBatch)
        on = config.batch_sampling
        self.decode = BiasedGenerationBatch.install(
            self.gen, model, default_on() if on is None else on
        )
        self.rows: dict[int, BatchedRow] = {}
        self.decode.failed = self.failed = self.gen.failed  # rows that failed alone this turn
        self.errored = False  # a row ended with an error (the engine then clears MLX's buffers)
        self._samplers: dict[int, Guarded] = {}  # a caller's sampler, guarded once (culprits.py)
        self.wave = (config.prefill_batch, config.prefill_tokens)  # floor, token budget
        self.draft_model: Any = None  # the engine's draft model, for rows drafting with it
        self.clears = config.clear_cache
        self.decode.phases = phases
        self.decode.clock = clock
        if config.step_order == "thread":
            self.decode.encoder = StepEncoder(clock)
        self.decode.thread_rows = config.thread_rows
        self.additive_mask = takes_additive(
            model
        )  # its prefill mask, additive where cuDNN takes it
        self.decode.wants = wants_of(self.rows)  # logprob figures built in the step (Readout)
        self._row_calls(None)
        self._stats_window = self.gen.stats()
        self.stats = self._stats_window.__enter__()  # mlx-lm's BatchStats for this batch

    def __len__(self) -> int:
        return len(self.rows)

    def insert(
        self,
        rows: list[BatchedRow],
        prompts: list[list[int]],
        caches: list[list[Any] | None] | None = None,
        histories: list[list[int]] | None = None,
    ) -> None:
        """Queue rows for batched prefill; a row with a cache continues from it."""
        histories = histories or [[] for _ in rows]
        segments = [
            self._segments(r, p, h) for r, p, h in zip(rows, prompts, histories, strict=True)
        ]
        # A fresh row gets the cache BatchGenerator would make, as mergeable layers.
        gen = self.gen
        caches = [
            mergeable(
                c if c is not None else make_prompt_cache(gen.model, gen.max_kv_size),
                self.additive_mask,
            )
            for c in caches or [None] * len(rows)
        ]
        uids = self.gen.insert_segments(
            segments,
            max_tokens=[r.req.max_tokens - len(r.generated) for r in rows],
            caches=caches,
            all_tokens=histories,
            samplers=[
                guard_sampler(r.sampler(), self._samplers, self.failed, self.rows) for r in rows
            ],
            logits_processors=[guard_processors(r, self.failed) for r in rows],
            stop_sequences=[r.out.stops for r in rows],
        )
        for uid, row in zip(uids, rows, strict=True):
            row.uid = uid
            self.rows[uid] = row
        if rows and (reg := rows[0].req.adapter_slots) is not None:  # the engine's adapters
            self._row_calls(uid_slots(reg, self.rows))
        if self.decode.drafting is None and any(drafts_in_batch(r.req) for r in rows):
            self.decode.drafting = Drafting(speculation_of(self.rows), lambda: self.draft_model)

    def _row_calls(self, slots: Callable[[Sequence[int]], AbstractContextManager] | None) -> None:
        """What every batched model call sets first, by uid in the call's row order: the rows'
        adapter slots, and a vision model's per-row state (each row's own mrope delta)."""
        vision, rows = self.vision, self.rows
        if slots is None and vision is None:
            return

        def around(uids: Sequence[int]) -> AbstractContextManager:
            stack = ExitStack()
            if slots is not None:
                stack.enter_context(slots(uids))
            if vision is not None:
                states = [r.model_state if (r := rows.get(u)) is not None else None for u in uids]
                stack.enter_context(vision.rows(states))
            return stack

        self.decode.adapter_rows = self.gen._prompt_batch.adapter_rows = around

    @staticmethod
    def _segments(row: BatchedRow, feed: list[int], history: list[int]) -> list[list[int]]:
        """The feed cut at the row's snapshot points (BatchGenerator's segments)."""
        row.offset = len(history)
        row.cuts = [c for c in row.cuts if row.offset < c < row.offset + len(feed)]
        segments, at = [], row.offset
        for c in row.cuts:
            segments.append(feed[at - row.offset : c - row.offset])
            at = c
        return [*segments, feed[at - row.offset :]]

    def _snapshots(self, prompt_responses: list[Any]) -> None:
        """Rows whose prefill just reached a snapshot point hand a copy to the store."""
        for r in prompt_responses:
            row = self.rows.get(r.uid)
            if row is None or row.plan is None or not row.cuts or not r.end_of_segment:
                continue
            at = row.offset + r.progress[0]
            if at != row.cuts[0]:
                continue
            row.cuts.pop(0)
            if r.end_of_prompt:
                continue
            tic = parts.start()
            cache, tokens = self.gen.extract_cache([r.uid])[r.uid]
            if len(tokens) == at and self.sharing is not None and row.plan.namespace:
                self.sharing.snapshot(row.req, row.plan, at, cache, solo=False)
            parts.stop("snapshots", tic)

    def _progress(self, prompt_responses: list[Any]) -> None:
        """Each prefilling row's `prompt_progress_callback(done, total)`, over its whole prompt
        as a serial row reports it (a row already decoding that moved here reports nothing)."""
        for r in prompt_responses:
            row = self.rows.get(r.uid)
            if row is None or (report := row.req.prompt_progress_callback) is None:
                continue
            done, total = row.offset + r.progress[0], row.offset + r.progress[1]
            if total == len(row.req.prompt):
                report(done, total)

    def _leave_parts(self, tic: float) -> None:
        """Traced: mlx-lm's next() filtered finished rows out after queueing the next step, so
        sync the step (`leave_step`), then the kept rows' caches (`filter`)."""
        batch = self.gen._generation_batch  # mlx-lm 0.32's GenerationBatch
        parts.stop("leave_step", tic, getattr(batch, "_next_tokens", None))
        tic = parts.start()
        parts.stop("filter", tic, [c.state for c in batch.prompt_cache])

    def _finished(self, row: BatchedRow, r: Any) -> None:
        plan = row.plan
        if self.sharing is not None and plan is not None and plan.namespace and r.prompt_cache:
            tic = parts.start()
            cache = clone(r.prompt_cache) if row.req.return_prompt_cache else r.prompt_cache
            self.sharing.finish(row.req, plan, list(r.all_tokens), cache, False)
            parts.stop("finish", tic, [c.state for c in cache])  # its copy into the store

    def settle(self) -> None:
        """This batch's last step queued: before the engine thread evaluates (overlap.py)."""
        self.decode.settle()

    def remove(self, row: BatchedRow) -> None:
        self.settle()
        if self.sharing is not None:
            self.sharing.forget(row.req)
        self.gen.remove([row.uid])
        self.rows.pop(row.uid, None)

    def lone_row(self) -> tuple[BatchedRow, list[Any], tuple[mx.array, mx.array]] | None:
        """The last row, its caches without padding and its pending token, when it is the only
        row left and nothing is prefilling. Reads BatchGenerator's decode state (mlx-lm 0.32's
        GenerationBatch: `_next_tokens`, `_next_logprobs`); tests/engine covers it."""
        gen = self.gen
        batch = gen._generation_batch
        self.settle()
        if len(self.rows) != 1 or len(batch) != 1:
            return None
        if len(gen._prompt_batch) or gen._unprocessed_sequences:
            return None
        row = next(iter(self.rows.values()))
        cache = batch.extract_cache(0)
        pending = (batch._next_tokens[0:1], batch._next_logprobs[0])
        return row, cache, pending

    def step(self) -> list[tuple[RequestHandle, TokenEvent | DoneEvent]]:
        """One BatchGenerator turn: a decode step for running rows, a prefill chunk for joiners."""
        gen = self.gen
        if gen._unprocessed_sequences:
            gen.prefill_batch_size = wave_size(gen, *self.wave)
        self.decode.settle_after = evaluates_after_step(gen)
        prompt_responses, responses = gen.next()
        tic = parts.start()  # None unless a trace times the parts
        if prompt_responses or tic is not None:
            self.decode.settle()  # snapshots and the trace's syncs evaluate here
        if tic is not None and any(r.finish_reason for r in responses):
            self._leave_parts(tic)
        if self.sharing is not None:
            self._snapshots(prompt_responses)
        self._progress(prompt_responses)
        events: list[tuple[RequestHandle, TokenEvent | DoneEvent]] = []
        failed = dict(self.failed)  # rows whose own input, processor or sampler raised
        self.failed.clear()
        reads = self.decode.current_read
        read: set[int] = set()  # a verify step answers a row with several tokens: the first
        drafting = self.decode.drafting  # has the step's figures, the rest their logprobs
        for r in responses:
            if failed and r.uid in failed:
                continue  # its token is not handed over (as a serial row's would not be)
            row = self.rows.get(r.uid)
            if row is None:
                continue  # it ended on an earlier token of this step
            try:  # its text, stop check or logprob figures raising end this row only
                row.generated.append(r.token)
                figures = reads.get(r.uid) if r.uid not in read else None
                read.add(r.uid)
                event, reason = row.out.token(r.token, r.logprobs, figures)
                event.finish = reason = reason or r.finish_reason
                if reason is None:
                    events.append((row.handle, event))
                    continue
                done = row.out.done(reason)
                if drafting is not None:
                    done.drafted_tokens, done.accepted_tokens = drafting.stats(r.uid)
                if row.req.return_prompt_cache:
                    done.prompt_cache = r.prompt_cache
                self._finished(row, r)
                events += [(row.handle, event), (row.handle, done)]
                del self.rows[r.uid]
            except Exception as e:  # noqa: BLE001 - see above
                failed[r.uid] = e
        if failed:
            self._end(failed, events)
        return events

    def _end(self, failed: dict[int, BaseException], events: list[tuple[Any, Any]]) -> None:
        """Rows that failed alone leave the batch (unless mlx-lm let them go) with their error."""
        for uid, e in failed.items():
            if (row := self.rows.get(uid)) is not None:
                log.warning("a batched row failed and ends alone: %r", e)
                self.remove(row)
                events.append((row.handle, row.out.done("error", e)))
                self.errored = True

    def discard(self) -> None:
        """Close a batch whose rows were ended elsewhere (a failed turn, shutdown)."""
        for end in (self._stop_encoder, self.gen.close):
            try:
                end()
            except Exception:  # noqa: BLE001 - it is being discarded anyway
                pass

    def _stop_encoder(self) -> None:
        if (encoder := self.decode.encoder) is not None:
            self.decode.encoder = None
            try:
                encoder.settle()
            except Exception:  # noqa: BLE001 - a step queued past the rows' last tokens
                log.exception("the batch's last queued step failed; no row reads it")
            finally:
                encoder.close()

    def close(self) -> None:
        self._stop_encoder()
        try:
            self.final_key = current_key()  # the thread's PRNG key after the batch's last draw
        except RuntimeError:  # a failed step left the key unevaluable
            self.final_key = None
            repair_key()
        self._stats_window.__exit__(None, None, None)
        self.gen.close()  # the engine clears after the last tokens went out (`clears`)
