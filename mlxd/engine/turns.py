"""One turn of each kind of row, called by the engine's loop: n > 1 prefills (forks), the lone
serial row, the batched rows. Each ends its own rows on error; the engine never stops."""

import logging
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from .batch import evaluates_after_step
from .crossing import crossing
from .handle import wake
from .moves import last_row_out
from .request import DoneEvent, TokenEvent
from .serial import SerialRow

log = logging.getLogger("mlxd.engine")


class Turns:
    """Mixed into Engine: the per-turn work on its rows (state lives on the Engine)."""

    _forks: list[Any]
    _serial: Any
    _batches: dict[Any, Any]
    config: Any
    _clear_due = False  # a closed batch's mx.clear_cache(), after its last events went out
    # MLX-CUDA throws on a failed cudaMallocAsync without first releasing its own cached
    # buffers (allocator.cpp), so after any failed step the engine releases them: the next
    # step, or another process on the GPU, gets that memory. Buffers only: no bits change.
    _trace: Any
    _kernels: Any
    admission: Any
    sharing: Any
    paths: Any
    _busy_s: float
    _admit: Callable[[Any], None]
    _shutdown: Callable[[], None]
    _fail_running: Callable[[Exception], None]
    _active: Callable[[], list[Any]]

    def _busy(self) -> bool:
        return self._serial is not None or bool(self._forks) or bool(self._batches)

    def _turn(self, only: Any = None) -> bool:
        """Admit, then one unit of each kind of row; on the engine thread or a driver's (which
        admits `only` its own request). False once the engine has shut down."""
        trace = self._trace
        try:
            trace.begin()
            if only is not None or self.admission.waiting:
                self._settle()  # joiners' stores and merges evaluate on this thread
            self._admit(only)
            if self.admission.closed:
                self._release_held()
                self._shutdown()
                trace.close()
                return False
            tic = time.perf_counter()
            trace.mark("admit")
            if not self._decode_only():
                self._release_held()  # a prefill or a serial row comes before the next step
                self._settle()
            if self._forks:
                self._fork_turn()
                trace.mark("fork")
            if self._serial is not None:
                self._serial_turn()
                trace.mark("serial")
            if self._batches:
                trace.batches(self._batches, before=True)
                self._batch_turns()
                trace.batches(self._batches, before=False)
                trace.mark("batch")
            if self.sharing is not None:
                if self.sharing.store.ssd is not None:
                    self._settle()  # a demotion reads entries on this thread
                self.sharing.tick()
                trace.mark("tick")
            self._busy_s += time.perf_counter() - tic
            trace.end(self._active, len(self.admission.waiting), self.paths)
            self._kernels.turn(sum(len(b) for b in self._batches.values()))
        except Exception as e:  # noqa: BLE001 - the loop must outlive any one turn's failure
            log.exception("engine turn failed; its rows end with the error")
            self._release_held()
            self._fail_running(e)
            mx.clear_cache()
        return True

    def _fork_turn(self) -> None:
        """One prefill chunk for each n > 1 prompt; ready ones fork into the batch."""
        for job in list(self._forks):
            try:
                for handle, out in job.drop_cancelled():
                    handle.put(out.done("cancelled"))
                if not job.handles:
                    self._forks.remove(job)
                    continue
                if not job.ready:
                    job.step()
                    continue
                self._forks.remove(job)
                rows, prompts, caches, histories = job.rows()
                if rows:
                    self._into_batch(rows, prompts, caches, histories)
            except Exception as e:  # noqa: BLE001 - one bad prompt never stops the engine
                if job in self._forks:
                    self._forks.remove(job)
                for handle, out in zip(job.handles, job.outs, strict=True):
                    handle.put(out.done("error", e))
                mx.clear_cache()

    def _serial_turn(self) -> None:
        row, handle, out = self._serial
        done: DoneEvent | None = None
        try:
            if handle.cancelled:
                done = out.done("cancelled")
            else:
                if (phases := self.config.phases) is not None:  # a serial row: the short
                    phases.waiting()  # interval throughout, whatever a batched step left set
                self._keys.enter(row, row.req.random_key)
                if row.prefilling:
                    self._prefill_chunk(row)
                elif (step := row.decode()) is None:
                    done = out.done("length")
                else:
                    row.emitted.append(step.token)
                    self._tokens += 1
                    event, reason = out.token(step.token, step.logprobs, step.read)
                    handle.put(event)
                    if reason is not None:
                        done = out.done(reason)
        except Exception as e:  # noqa: BLE001 - one bad row never stops the engine
            done = out.done("error", e)
        if done is not None:
            done.random_key = self._keys.leave(row)
            if row.req.return_prompt_cache:
                done.prompt_cache = row.cache
            self._keep(row, done)
            self._serial, self._alone = None, False
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

    def _batch_turns(self) -> None:
        """A step of every batch (one per KV format). Rows whose KV turned quantized move from
        the unquantized batch to their format's batch (crossing.py)."""
        events = []
        for fmt in list(self._batches):
            batch = self._batches[fmt]
            for other in self._batches.values():
                if other is not batch:  # their encoders share the stream (encoder.py)
                    other.settle()
            events += self._batch_turn(batch)
            if fmt is None and len(batch):
                joiners = crossing(batch, events)
                if joiners:
                    self.paths["crossed to quantized"] += len(joiners)
                    self._into_batch(*map(list, zip(*joiners, strict=True)))
            if not len(batch):
                self._close(fmt, batch)
        lone = [b for b in self._batches.values() if len(b)]
        if self.drain_to_serial and not self.admission.waiting and not self._forks:
            if self._serial is None and len(lone) == 1 and len(lone[0]) == 1:
                if (serial := last_row_out(lone[0], self.step_model(), self._keys)) is not None:
                    serial[0].clears = self.config.clear_cache
                    self._serial = serial
                    self.paths["batched->serial"] += 1
                    if not len(lone[0]):
                        self._close(lone[0].fmt, lone[0])
        watchers = []
        for handle, event in events:
            self._tokens += isinstance(event, TokenEvent)
            watchers += handle.put_quiet(event)
        phases = self.config.phases
        if phases is not None and phases.hold_wakes and self._decode_only():
            phases.held.hold(watchers)  # woken as the next step is queued (gil.py)
        else:
            self._release_held()
            wake(watchers)
        if self._clear_due:
            self._clear_due = False
            mx.clear_cache()

    def _decode_only(self) -> bool:
        """The next turn is a decode step of running batches and nothing else."""
        if self._forks or self._serial is not None or not self._batches:
            return False
        return not any(evaluates_after_step(b.gen) for b in self._batches.values())

    def _settle(self) -> None:
        """Every batch's last step queued by its encoder thread (`--step-order thread`)."""
        for batch in self._batches.values():
            batch.settle()

    def _release_held(self) -> None:
        if (phases := self.config.phases) is not None:
            phases.held.release()

    def _close(self, fmt: Any, batch: Any) -> None:
        batch.close()
        self._clear_due = self._clear_due or batch.clears
        self.last_batch_stats = batch.stats
        self.last_batch_key = batch.final_key
        if self._batches.get(fmt) is batch:
            del self._batches[fmt]

    def _batch_turn(self, batch: Any) -> list[tuple[Any, Any]]:
        for row in [r for r in batch.rows.values() if r.handle.cancelled]:
            batch.remove(row)  # its cache is not kept: extracting it would cost a copy
            row.handle.put(row.out.done("cancelled"))
        try:
            return batch.step() if len(batch) else []
        except Exception as e:  # noqa: BLE001 - a failed step ends the rows in it, not the engine
            log.exception("batched step failed; its rows end with the error")
            events = [(r.handle, r.out.done("error", e)) for r in batch.rows.values()]
            batch.rows.clear()
            self._clear_due = True  # once the failed batch has closed
            return events
