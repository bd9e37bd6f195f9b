"""The running rows of one engine and one turn of each kind: n > 1 and quantized-KV prefills
(prefill jobs), the lone serial row, and the batched rows (one BatchedRows per KV format).
Each turn ends its own rows on error; the engine never stops. Engine thread only, except
`active()`, read under the admission lock."""

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from ..config import EngineConfig
from ..kv.batch_quantized import batch_format, is_quantized
from ..model.folded_attention import is_folded
from ..model.plain_rows import PlainRowsTwin
from ..store.layers import clone
from .batch import BatchedRows, evaluates_after_step
from .draft_row import DraftRow
from .moves import (
    ForkJob,
    Serial,
    crossing,
    drafting_gave_up,
    last_row_out,
    quantizes,
    serial_into_batch,
)
from .overlap import StepPhases
from .prefix import PrefixSharing
from .request import DoneEvent, GenerationRequest, RequestHandle, TokenEvent, wake
from .rng import KeyOwner, set_key
from .serial import SerialRow

log = logging.getLogger("mlxd.engine")


class Rows:
    """Every running row of one engine: where each is, and its next unit of work."""

    def __init__(
        self,
        model: Callable[[], Any],
        config: EngineConfig,
        tokenizer: Any,
        sharing: PrefixSharing | None,
        phases: StepPhases | None,
        clock: Any,
        drain_to_serial: bool,
    ) -> None:
        self._model, self.config, self.tokenizer = model, config, tokenizer
        self.sharing, self.phases, self.clock = sharing, phases, clock
        self.drain_to_serial = drain_to_serial  # a batch's last row returns to serial caches
        self.serial: Serial | None = None
        self.alone = False  # the serial row cannot share the batched step
        self.batches: dict[Any, BatchedRows] = {}  # by KV format (None: unquantized)
        self.draft_model: Any = None  # the engine's draft model (Engine.use_draft)
        self.forks: list[ForkJob] = []  # n > 1 prompts and quantized prefills, alone
        self.groups: dict[int, list[RequestHandle]] = {}  # n > 1: first handle -> siblings
        self.keys = KeyOwner()
        self.paths: Counter[str] = Counter()  # which path each row took (stats, tests)
        self.tokens = 0
        self.last_batch_stats: Any = None  # mlx-lm BatchStats of the last finished batch
        self.last_batch_key: tuple[int, int] | None = None  # the PRNG key it ended with
        self._plain_rows = PlainRowsTwin()  # what step_model() hands out
        # A closed batch's mx.clear_cache(), after its last events went out. MLX-CUDA throws on
        # a failed cudaMallocAsync without releasing its cached buffers, so a failed step
        # releases them too. Buffers only: no bits change.
        self._clear_due = False

    def step_model(self) -> Any:
        """The model a serial row and an mlx-mode batch step: its plain-rows twin
        (model/plain_rows.py) unless that is off. Folded batches fold the model itself."""
        if not self.config.decode_rows:
            return self._model()
        return self._plain_rows.of(self._model(), self.config.decode_fused)

    # what runs
    def active(self) -> list[RequestHandle]:
        handles = [self.serial[1]] if self.serial else []
        handles += [h for job in self.forks for h in job.handles]
        return handles + [r.handle for b in self.batches.values() for r in b.rows.values()]

    def requests(self) -> list[GenerationRequest]:
        reqs = [self.serial[0].req] if self.serial else []
        reqs += [job.req for job in self.forks]
        return reqs + [r.req for b in self.batches.values() for r in b.rows.values()]

    def busy(self) -> bool:
        return self.serial is not None or bool(self.forks) or bool(self.batches)

    def decode_only(self) -> bool:
        """The next turn is a decode step of running batches and nothing else."""
        if self.forks or self.serial is not None or not self.batches:
            return False
        return not any(evaluates_after_step(b.gen) for b in self.batches.values())

    def cache_bytes(self) -> int:
        active = sum(c.nbytes for c in self.serial[0].cache) if self.serial is not None else 0
        return active + sum(b.gen.prompt_cache_nbytes for b in self.batches.values())

    def settle(self) -> None:
        """Every batch's last step queued by its encoder thread (`--step-order thread`)."""
        for batch in self.batches.values():
            batch.settle()

    def release_held(self) -> None:
        if self.phases is not None:
            self.phases.held.release()

    # where rows go
    def add_fork(self, job: ForkJob, path: str, count: int = 1) -> None:
        if job.embeds:  # (n > 1 is refused at submit: each sibling would need its embedding)
            path = "embeddings prefill"  # alone beside the batch, then it decodes there
        job.row.clears = self.config.clear_cache
        self.forks.append(job)
        self.paths[path] += count

    def into_batch(self, rows, prompts, caches, histories) -> None:
        """Insert joiners into the batch of their KV format (created on demand); a serial row
        joins them first."""
        if not self.batches and self.serial is None:
            first = rows[0].req
            if first.random_key is not None and first.draws is None:
                set_key(first.random_key)  # a user sampler draws from the thread's key
        if self.serial is not None and not self._serial_to_prefill_job():
            self.paths["serial->batched"] += 1
            moved, emitted = serial_into_batch(self.serial, self.keys)
            self.tokens += emitted  # its pending token, emitted as it moves
            self.serial = None
            if moved is not None:
                for xs, x in zip((rows, prompts, caches, histories), moved, strict=True):
                    xs.insert(0, x)
        by_format: dict[Any, list[int]] = {}
        for i, cache in enumerate(caches):
            by_format.setdefault(batch_format(cache), []).append(i)
        for fmt, idx in by_format.items():
            if fmt not in self.batches:
                folded = is_folded(self.config.attention)
                model = self._model() if folded else self.step_model()
                self.batches[fmt] = BatchedRows(
                    model, self.config, self.sharing, fmt, self.phases, self.clock
                )
            parts = [[xs[i] for i in idx] for xs in (rows, prompts, caches, histories)]
            self.batches[fmt].draft_model = self.draft_model
            self.batches[fmt].insert(*parts)

    def _serial_to_prefill_job(self) -> bool:
        """A quantized-KV serial row mid-prefill goes on prefilling alone, beside the batch
        (its conversion must land after mlx-lm's chunk): it becomes a prefill job."""
        row, handle, out = self.serial
        embeds = row.prefilling and row.req.input_embeddings is not None
        if not embeds:  # a row with embeddings prefills them alone (the batch feeds ids)
            if not row.prefilling or not quantizes(row.req):
                return False
            if row.total - row.processed <= 1:
                return False
            if not is_quantized(row.cache) and row.total - 1 < row.req.quantized_kv_start:
                return False
        self.keys.leave(row)
        job = ForkJob(self._model(), row.req, [handle], generation_stream, self.tokenizer,
                      row.plan, outs=[out], row=row)  # fmt: skip
        self.forks.append(job)
        self.serial = None
        self.paths["serial->embeddings prefill" if embeds else "serial->quantized prefill"] += 1
        return True

    # one turn of each kind
    def fork_turn(self) -> None:
        """One prefill chunk for each prefill job; ready ones join the batch."""
        for job in list(self.forks):
            try:
                for handle, out in job.drop_cancelled():
                    handle.put(out.done("cancelled"))
                if not job.handles:
                    self.forks.remove(job)
                    continue
                if not job.ready:
                    if job.samples_next:  # its first token draws from its own key
                        self.keys.enter(job.row, job.req.random_key)
                    job.step()
                    continue
                self.forks.remove(job)
                if job.embeds:  # prefilled and sampled alone: it joins decoding
                    moved, emitted = job.joiner(self.keys)
                    self.tokens += emitted
                    self.paths["serial->batched"] += 1
                    if moved is not None:
                        self.into_batch(*([x] for x in moved))
                    continue
                rows, prompts, caches, histories = job.rows()
                if rows:
                    self.into_batch(rows, prompts, caches, histories)
            except Exception as e:  # noqa: BLE001 - one bad prompt never stops the engine
                if job in self.forks:
                    self.forks.remove(job)
                for handle, out in zip(job.handles, job.outs, strict=True):
                    handle.put(out.done("error", e))
                mx.clear_cache()

    def serial_turn(self) -> None:
        row, handle, out = self.serial
        done: DoneEvent | None = None
        try:
            if handle.cancelled:
                done = out.done("cancelled")
            else:
                if self.phases is not None:  # a serial row: the short interval throughout,
                    self.phases.waiting()  # whatever a batched step left set
                self.keys.enter(row, row.req.random_key)
                if row.prefilling:
                    self._prefill_chunk(row)
                elif (step := row.decode()) is None:
                    done = out.done("length")
                else:
                    row.emitted.append(step.token)
                    self.tokens += 1
                    event, reason = out.token(step.token, step.logprobs, step.read)
                    event.from_draft = step.from_draft
                    handle.put(event)
                    if reason is not None:
                        done = out.done(reason)
        except Exception as e:  # noqa: BLE001 - one bad row never stops the engine
            done = out.done("error", e)
        if done is not None:
            if isinstance(row, DraftRow):
                row.finish(done)  # mlx-lm's final rewind of its caches; the draft counts
            done.random_key = self.keys.leave(row)
            if row.req.return_prompt_cache:
                done.prompt_cache = row.cache
            self.keep(row, done)
            self.serial, self.alone = None, False
            clears = row.clears or done.reason == "error"
            del row  # the caches go before the caller hears "done"
            if clears:
                mx.clear_cache()
            handle.put(done)

    def _prefill_chunk(self, row: SerialRow) -> None:
        """One chunk, timed for the prefix store (its disk tier competes with prefilling)."""
        before, tic = row.processed, time.perf_counter()
        row.prefill_chunk()
        if self.sharing is not None and row.processed > before:
            self.sharing.store.observe_prefill(row.processed - before, time.perf_counter() - tic)

    def keep(self, row: SerialRow, done: DoneEvent) -> None:
        """A serial row's cache goes to the prefix store when it ends (not after an error)."""
        if self.sharing is None or row.plan is None or not row.plan.namespace:
            return
        if done.reason == "error" or row.fed == 0:
            self.sharing.forget(row.req)
            return
        tokens = (row.req.prompt.tolist() + row.emitted)[: row.fed]
        cache = clone(row.cache) if row.req.return_prompt_cache else row.cache
        self.sharing.finish(row.req, row.plan, tokens, cache, solo=True)

    def batch_turns(self, waiting: bool) -> None:
        """A step of every batch (one per KV format). Rows whose KV turned quantized move from
        the unquantized batch to their format's batch (moves.py). `waiting`: requests wait
        to join, so a batch's last row stays batched."""
        events = []
        for fmt in list(self.batches):
            batch = self.batches[fmt]
            for other in self.batches.values():
                if other is not batch:  # their encoders share the stream (overlap.py)
                    other.settle()
            events += self._batch_turn(batch)
            if fmt is None and len(batch):
                joiners = crossing(batch, events)
                if joiners:
                    self.paths["crossed to quantized"] += len(joiners)
                    self.into_batch(*map(list, zip(*joiners, strict=True)))
            if not len(batch):
                self._close(fmt, batch)
        lone = [b for b in self.batches.values() if len(b)]
        # a drafting row whose drafts stopped paying leaves too: its bits were the batch's
        drain = self.drain_to_serial or (len(lone) == 1 and drafting_gave_up(lone[0]))
        if drain and not waiting and not self.forks:
            if self.serial is None and len(lone) == 1 and len(lone[0]) == 1:
                if (serial := last_row_out(lone[0], self.step_model(), self.keys)) is not None:
                    serial[0].clears = self.config.clear_cache
                    self.serial = serial
                    self.paths["batched->serial"] += 1
                    if not len(lone[0]):
                        self._close(lone[0].fmt, lone[0])
        watchers = []
        for handle, event in events:
            self.tokens += isinstance(event, TokenEvent)
            watchers += handle.put_quiet(event)
        if self.phases is not None and self.decode_only():
            self.phases.held.hold(watchers)  # woken as the next step is queued (overlap.py)
        else:
            self.release_held()
            wake(watchers)
        if self._clear_due:
            self._clear_due = False
            mx.clear_cache()

    def _close(self, fmt: Any, batch: BatchedRows) -> None:
        batch.close()
        self._clear_due = self._clear_due or batch.clears
        self.last_batch_stats = batch.stats
        self.last_batch_key = batch.final_key
        if self.batches.get(fmt) is batch:
            del self.batches[fmt]

    def _batch_turn(self, batch: BatchedRows) -> list[tuple[Any, Any]]:
        for row in [r for r in batch.rows.values() if r.handle.cancelled]:
            batch.remove(row)  # its cache is not kept: extracting it would cost a copy
            row.handle.put(row.out.done("cancelled"))
        try:
            events = batch.step() if len(batch) else []
            if batch.errored:  # a row failed alone (generator.py): its buffers go too
                batch.errored, self._clear_due = False, True
            return events
        except Exception as e:  # noqa: BLE001 - a failed step no row's input explains ends them all
            log.exception("batched step failed; its rows end with the error")
            own = dict(batch.failed)  # rows found failing alone before it: their own error
            batch.failed.clear()
            events = [(r.handle, r.out.done("error", own.get(uid, e)))
                      for uid, r in batch.rows.items()]  # fmt: skip
            batch.rows.clear()
            self._clear_due = True  # once the failed batch has closed
            return events

    # ending
    def drop_all(self) -> list[RequestHandle]:
        """Every row ended without events (a failed turn, shutdown): their handles, for the
        caller to end. Batches are discarded and the PRNG keys start clean."""
        handles = self.active() + [h for group in self.groups.values() for h in group]
        for batch in self.batches.values():
            batch.discard()
        self.serial, self.alone, self.batches, self.forks, self.groups = None, False, {}, [], {}
        self.keys = KeyOwner()
        return handles
