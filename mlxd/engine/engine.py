"""The Engine: one thread owns all MLX work; callers submit requests and read events.

A lone row runs on plain serial caches: mlx-lm's generate_step, op for op (`serial.py`).
When a second row joins, the serial row hands its caches to the batched step (`batch.py`,
mlx-lm's BatchGenerator pieces) and every row runs there until the batch drains. Requests the
batched step cannot run (quantized KV, ...) run alone, never silently downgraded.
"""

import atexit
import collections
import threading
import time
import weakref
from typing import Any

import mlx.core as mx

# mlx-lm's thread-local generation stream: each thread that enters it gets its own stream.
from mlx_lm.generate import generation_stream

from .batch import BatchedRow, BatchedRows, batchable
from .handle import RequestHandle
from .kv_budget import KVBudgetExceeded, KVCost
from .materialize import materialize
from .output import RowOutput, prepare
from .request import DoneEvent, GenerationRequest, TokenEvent
from .rng import KeyOwner, current_key, set_key
from .serial import SerialRow, validate
from .threads import run_on_worker

_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # An engine thread still inside MLX at interpreter exit aborts the process: stop them first.
    for engine in list(_live):
        engine.close()


class Overloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class Engine:
    def __init__(
        self,
        model: Any,
        batch: int = 8,
        max_queue: int = 1024,
        prefill_step_size: int = 2048,
        weak_model: bool = False,
        tokenizer: Any | None = None,
        kv_budget: int | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        # weak_model: the Python API's engines must not keep a dropped model alive.
        self._model = weakref.ref(model) if weak_model else (lambda: model)
        materialize(model)
        self.batch, self.max_queue, self.prefill_step_size = batch, max_queue, prefill_step_size
        self.tokenizer = tokenizer  # when given, token events carry text deltas
        self.kv_budget = kv_budget
        self._kv_cost = KVCost.probe(model) if kv_budget is not None else None
        self._kv_need: dict[int, int] = {}  # id(handle) -> worst-case bytes, while active
        self._tokens, self._busy_s = 0, 0.0
        self._waiting: collections.deque[tuple[GenerationRequest, RequestHandle]] = (
            collections.deque()
        )
        self._serial: tuple[SerialRow, RequestHandle, RowOutput] | None = None
        self._alone = False  # the serial row cannot share the batched step
        self._batch: BatchedRows | None = None
        self.paths: collections.Counter[str] = collections.Counter()
        self._wake = threading.Condition()
        self._closed = False
        self._keys = KeyOwner()
        self._stopped = threading.Event()
        self._thread = run_on_worker(self._loop, self._stopped)
        _live.add(self)

    @property
    def model(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this engine was garbage-collected")
        return model

    def submit(self, req: GenerationRequest) -> RequestHandle:
        return self.submit_many([req])[0]

    def submit_many(self, reqs: list[GenerationRequest]) -> list[RequestHandle]:
        """Submit requests atomically: admitted in one round, they share one batch composition."""
        for req in reqs:
            validate(req, self.model)
            self._check_budget(req)
            prepare(req)
            materialize(req.prompt, req.input_embeddings, req.prompt_cache)
        handles = [RequestHandle() for _ in reqs]
        with self._wake:
            if self._closed:
                raise RuntimeError("engine is closed")
            if len(self._waiting) + len(reqs) > self.max_queue:
                raise Overloaded(f"{len(self._waiting)} requests waiting (max_queue)")
            self._waiting.extend(zip(reqs, handles, strict=True))
            self._wake.notify()
        return handles

    def _check_budget(self, req: GenerationRequest) -> None:
        if self._kv_cost is None:
            return
        need = self._kv_cost.worst(req)
        if need > self.kv_budget:
            raise KVBudgetExceeded(
                f"request needs {need} bytes of KV cache (prompt {len(req.prompt)} + "
                f"max_tokens {req.max_tokens} tokens) but kv_budget is {self.kv_budget} bytes"
            )

    def _active_handles(self) -> list[RequestHandle]:
        handles = [self._serial[1]] if self._serial else []
        return handles + ([r.handle for r in self._batch.rows.values()] if self._batch else [])

    def _fits(self, req: GenerationRequest, handle: RequestHandle, pending: list) -> bool:
        """Reserve the row's worst case if it fits beside the active and admitted rows."""
        if self._kv_cost is None:
            return True
        live = {id(h) for h in self._active_handles()} | {id(h) for _, h in pending}
        self._kv_need = {k: v for k, v in self._kv_need.items() if k in live}
        need = self._kv_cost.worst(req)
        if sum(self._kv_need.values()) + need > self.kv_budget:
            return False
        self._kv_need[id(handle)] = need
        return True

    def kv_bytes_reserved(self) -> int:
        return sum(self._kv_need.values())

    def _n_active(self) -> int:
        return (self._serial is not None) + (len(self._batch) if self._batch else 0)

    def stats(self) -> dict[str, Any]:
        """Rows, throughput over the engine's busy time, reserved KV, and the paths taken."""
        with self._wake:
            live = {id(h) for h in self._active_handles()}
            busy = self._busy_s
            return {
                "active": self._n_active(),
                "waiting": len(self._waiting),
                "tokens_generated": self._tokens,
                "tokens_per_s": self._tokens / busy if busy > 0 else 0.0,
                "kv_bytes_reserved": sum(v for k, v in self._kv_need.items() if k in live),
                "kv_budget": self.kv_budget,
                "paths": dict(self.paths),
            }

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._stopped.wait(timeout=30)

    # engine thread: admission
    def _take_joiners(self) -> list[tuple[GenerationRequest, RequestHandle]]:
        with self._wake:
            while not self._n_active() and not self._waiting and not self._closed:
                self._wake.wait()
            joiners = []
            while self._waiting and not self._alone:
                req, handle = self._waiting[0]
                if handle.cancelled:
                    self._waiting.popleft()
                    handle.put(DoneEvent("cancelled"))
                    continue
                if self._n_active() + len(joiners) >= self.batch:
                    break
                if batchable(req) is not None:
                    if self._n_active() or joiners:
                        break  # FIFO: it waits until it can run alone
                if not self._fits(req, handle, joiners):
                    break  # FIFO: it waits until enough KV is free
                self._alone = batchable(req) is not None
                joiners.append(self._waiting.popleft())
                if self._alone:
                    break
            return joiners

    def _admit(self) -> None:
        joiners = self._take_joiners()
        if not joiners:
            return
        outs = [RowOutput(req, self.tokenizer, h.submitted) for req, h in joiners]
        if not self._n_active() and len(joiners) == 1:
            (req, handle), out = joiners[0], outs[0]
            self.paths["alone" if self._alone else "serial"] += 1
            try:
                self._serial = (SerialRow(self.model, req, generation_stream), handle, out)
            except Exception as e:  # noqa: BLE001 - the caller re-raises it
                self._alone = False
                handle.put(out.done("error", e))
            return
        self.paths["batched"] += len(joiners)
        if self._batch is None:
            self._batch = BatchedRows(self.model, self.batch, self.prefill_step_size, None)
            first = joiners[0][0]
            if self._serial is None and first.random_key is not None and first.draws is None:
                set_key(first.random_key)  # a user sampler draws from the thread's key
        rows = [
            BatchedRow(req, h, out, key=req.random_key)
            for (req, h), out in zip(joiners, outs, strict=True)
        ]
        prompts = [req.prompt.tolist() for req, _ in joiners]
        caches: list[list[Any] | None] = [None] * len(rows)
        histories: list[list[int]] = [[] for _ in rows]
        if self._serial is not None:
            self._migrate_serial(rows, prompts, caches, histories)
        self._batch.insert(rows, prompts, caches, histories)

    def _migrate_serial(self, rows, prompts, caches, histories) -> None:
        """The serial row joins the batch with its caches (adopt, don't recompute)."""
        row, handle, out = self._serial
        self._serial = None
        self.paths["serial->batched"] += 1
        feed, in_cache, logprobs = row.handoff()
        moved = BatchedRow(row.req, handle, out, generated=list(row.emitted))
        if logprobs is not None:  # a decoding row: its pending token is emitted first
            in_cache = in_cache + row.emitted
            moved.generated.append(feed[0])
            event, reason = out.token(feed[0], logprobs)
            handle.put(event)
            if reason is not None:
                done = out.done(reason)
                done.random_key = self._keys.leave(row)
                handle.put(done)
                return
        key = self._keys.leave(row)
        moved.key = key if row.req.random_key is not None else None
        rows.insert(0, moved)
        prompts.insert(0, feed)
        caches.insert(0, row.cache)
        histories.insert(0, in_cache)

    # engine thread: work
    def _serial_turn(self) -> None:
        row, handle, out = self._serial
        done: DoneEvent | None = None
        try:
            if handle.cancelled:
                done = out.done("cancelled")
            else:
                self._keys.enter(row, row.req.random_key)
                if row.prefilling:
                    row.prefill_chunk()
                elif (step := row.decode()) is None:
                    done = out.done("length")
                else:
                    row.emitted.append(step.token)
                    self._tokens += 1
                    event, reason = out.token(step.token, step.logprobs)
                    handle.put(event)
                    if reason is not None:
                        done = out.done(reason)
        except Exception as e:  # noqa: BLE001 - one bad row never stops the engine
            done = out.done("error", e)
        if done is not None:
            done.random_key = self._keys.leave(row)
            self._serial, self._alone = None, False
            del row  # the caches go before the caller hears "done"
            mx.clear_cache()
            handle.put(done)

    def _batch_turn(self) -> None:
        batch = self._batch
        for row in [r for r in batch.rows.values() if r.handle.cancelled]:
            batch.remove(row)
            row.handle.put(row.out.done("cancelled"))
        try:
            events = batch.step() if len(batch) else []
        except Exception as e:  # noqa: BLE001 - a failed step ends the rows in it, not the engine
            events = [(r.handle, r.out.done("error", e)) for r in batch.rows.values()]
            batch.rows.clear()
        if len(batch) == 1 and not self._waiting:
            self._leave_batch(batch)
        if not len(batch):
            batch.close()
            self._batch = None
        for handle, event in events:
            self._tokens += isinstance(event, TokenEvent)
            handle.put(event)

    def _leave_batch(self, batch: BatchedRows) -> None:
        """The batch drained to one row: it goes back to the serial fast path, unpadded."""
        lone = batch.lone_row()
        if lone is None:
            return
        brow, cache, pending = lone
        req = brow.req
        history = req.prompt.tolist() + brow.generated
        row = SerialRow.resume(
            self.model, req, generation_stream, cache, pending, history, brow.generated
        )
        batch.remove(brow)
        if (key := brow.current_key()) is not None:
            self._keys.adopt(row, key)
        elif req.random_key is not None:
            self._keys.adopt(row, current_key())  # it drew from the thread's key: continue it
        self._serial = (row, brow.handle, brow.out)
        self.paths["batched->serial"] += 1

    def _shutdown(self) -> None:
        handles = self._active_handles()
        self._serial, self._batch = None, None
        with self._wake:
            handles += [h for _, h in self._waiting]
            self._waiting.clear()
        for handle in handles:
            handle.put(DoneEvent("cancelled"))

    def _loop(self) -> None:
        while True:
            self._admit()
            if self._closed:
                self._shutdown()
                return
            tic = time.perf_counter()
            if self._serial is not None:
                self._serial_turn()
            if self._batch is not None:
                self._batch_turn()
            self._busy_s += time.perf_counter() - tic
