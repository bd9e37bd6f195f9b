"""The Engine: one thread owns all MLX work; callers submit requests and read events.

The loop is three calls a turn: the scheduler takes joiners and routes them (scheduler.py), the
rows run one unit of work each (rows.py), and their events go to the callers' handles.
A lone row runs on plain serial caches: mlx-lm's generate_step, op for op (`serial.py`; its
one-token steps over 2-D rows, fewer views, the same kernels: model/plain_rows.py).
When a second row joins, the serial row hands its caches to the batched step (`batch.py`,
mlx-lm's BatchGenerator pieces) and every row runs there until the batch drains. Requests the
batched step cannot run (quantized KV, ...) run alone, never silently downgraded.
"""

import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import mlx.core as mx

from ..config import EngineConfig, from_env
from ..model.folded_attention import is_folded
from ..model.folded_attention import unsupported as unfoldable
from .adapters import EngineAdapters
from .admission import Admission, KVCost, Overloaded
from .arrivals import Arrivals, Ticket
from .batch_row import batchable
from .draft_row import drafts
from .driver import Driver
from .instrument import Trace
from .kernel_window import KernelWindow
from .moves import drain_keeps_bits
from .output import prepare
from .overlap import StepPhases, run_on_worker, step_phases
from .prefix import PrefixSharing
from .request import DoneEvent, GenerationRequest, RequestHandle, TokenEvent, materialize
from .rng import repair_key
from .rows import Rows
from .scheduler import Scheduler
from .serial import validate
from .snapshot import rows_snapshot
from .speculate.draft_model import draft_refusal
from .speculate.drafting import drafts_in_batch, model_drafts, refusal

__all__ = ["Engine", "Overloaded"]

_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()
log = logging.getLogger("mlxd.engine")


@atexit.register
def _close_all() -> None:
    # An engine thread still inside MLX at interpreter exit aborts the process: stop them first.
    for engine in list(_live):
        engine.close()


class Engine:
    """Submit requests from any thread; all MLX work happens on the engine's own thread.

    `config`: the engine's settings (mlxd.config.EngineConfig); keyword `settings` override its
    fields (`Engine(model, batch=4)`). `phases` replaces the GIL phases `gil_phases` makes.
    `draft_model`: what requests with `Speculation(mode="draft")` draft with, alone
    (draft_row.py), and those with mode "model" in the batched step (speculate/)."""

    def __init__(
        self,
        model: Any,
        config: EngineConfig | None = None,
        *,
        tokenizer: Any | None = None,
        prefix_store: Any = None,
        namespace: str = "",
        arrivals: Arrivals | None = None,
        weak_model: bool = False,
        phases: StepPhases | None = None,
        draft_model: Any = None,
        **settings: Any,
    ) -> None:
        config = from_env(replace(config or EngineConfig(), **settings))
        # weak_model: the Python API's engines must not keep a dropped model alive.
        self._model = weakref.ref(model) if weak_model else (lambda: model)
        materialize(model)
        self.config = config
        self.batch = config.batch
        if is_folded(config.attention) and (why := unfoldable(model, config.attention)):
            raise ValueError(why)
        self.tokenizer = tokenizer  # when given, token events carry text deltas
        self.kv_budget = config.kv_budget
        self.admission = Admission(config.batch, config.max_queue, config.kv_budget, model, config)
        # arrivals: a server's requests on their way; a new wave waits for them up to its
        # window (arrivals.py), so turns that arrive together prefill together. None: off.
        self.arrivals = arrivals or Arrivals(0.0)
        self.arrivals.attach(self.admission.wake)
        # Bytes per token per KV scheme, for stats (probed here: the engine thread is not up).
        self.kv_cost = self.admission.kv_cost or KVCost.probe(model)
        self._kv_schemes: set[tuple[int, int]] = set()  # (bits, group) of requests seen
        # The prefix store (layer 0), keyed by `namespace`: the model, its adapter, ...
        self.sharing = PrefixSharing(prefix_store, namespace) if prefix_store is not None else None
        self.trace = Trace.of(config.trace)  # a line per turn; else a no-op
        self.kernels = KernelWindow.of(config.kernels, config.kernels_at)  # GPU time; else no-op
        clock = getattr(self.kernels, "clock", None)  # the window times the step's parts too
        if isinstance(self.kernels, KernelWindow):
            self.kernels.order = config.step_order
        self.phases = phases if phases is not None else step_phases(config.gil_phases)
        # serial_fast_path: a lone row runs serial caches, and a batch's last row returns to them
        # where that keeps its bits (moves.py). Off: every row runs BatchGenerator's step.
        drain = config.serial_fast_path and drain_keeps_bits(config.attention)
        self.rows = Rows(self._model_or_raise, config, tokenizer, self.sharing, self.phases,
                         clock, drain)  # fmt: skip
        self.scheduler = Scheduler(self._model_or_raise, config, self.admission, self.arrivals,
                                   self.rows, self.sharing, tokenizer)  # fmt: skip
        self.driver = Driver(self.admission, self.rows, self._turn)
        self.adapters = EngineAdapters(self._model_or_raise)  # per-row LoRA (adapters.py)
        self.use_draft(draft_model)
        self._busy_s = 0.0
        self._stopped = threading.Event()
        self._thread = run_on_worker(self._loop, self._stopped)
        _live.add(self)

    def _model_or_raise(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this engine was garbage-collected")
        return model

    @property
    def model(self) -> Any:
        return self._model_or_raise()

    @property
    def paths(self) -> collections.Counter[str]:
        """How many rows took each path (serial, batched, forked, ...)."""
        return self.rows.paths

    @property
    def last_batch_stats(self) -> Any:
        return self.rows.last_batch_stats

    @property
    def last_batch_key(self) -> tuple[int, int] | None:
        return self.rows.last_batch_key

    def step_model(self) -> Any:
        return self.rows.step_model()

    # any thread
    # `handle(s)`: the caller's own RequestHandle subclass (an engine process forwards events).
    def submit(
        self,
        req: GenerationRequest,
        arrival: Ticket | None = None,
        handle: RequestHandle | None = None,
    ) -> RequestHandle:
        """`arrival`: the request's ticket from a server's `arrivals`, released as it queues."""
        return self._submit([req], [handle or RequestHandle()], arrival)[0]

    def submit_many(
        self, reqs: list[GenerationRequest], handles: list[RequestHandle] | None = None
    ) -> list[RequestHandle]:
        """Submit requests atomically: admitted in one round, they share one batch composition."""
        return self._submit(reqs, handles or [RequestHandle() for _ in reqs])

    def submit_n(
        self,
        req: GenerationRequest,
        n: int,
        arrival: Ticket | None = None,
        handles: list[RequestHandle] | None = None,
    ) -> list[RequestHandle]:
        """`n` rows sampled from one prompt that is prefilled once (OpenAI's `n`). With a
        seed, row i samples from the stream of seed + i."""
        if n < 1:
            raise ValueError("n must be >= 1")
        if n > self.batch:  # it could never be admitted, and would block the queue behind it
            raise ValueError(f"n must be at most {self.batch} (the engine's batch size)")
        if n > 1 and (why := batchable(req, self.config)) is not None:
            raise ValueError(f"n > 1 needs the batched step, and {why}")
        if n > 1 and req.input_embeddings is not None:  # each sibling would need its last one
            raise ValueError("n > 1 does not run with input embeddings")
        req.n = n
        handles = handles or [RequestHandle() for _ in range(n)]
        groups = self.rows.groups
        groups[id(handles[0])] = handles[1:]  # before the engine can see the request
        self.adapters.acquire_siblings(req, handles[1:])  # counted before any can end
        try:
            self._submit([req], handles[:1], arrival)
        except BaseException:
            groups.pop(id(handles[0]), None)
            for h in handles[1:]:
                h.run_on_done()  # their counts back
            raise
        return handles

    def use_draft(self, draft_model: Any) -> None:
        """Draft rows that start from now on draft with `draft_model` (None: refused)."""
        if draft_model is not None and draft_model is not self.scheduler.draft_model:
            materialize(draft_model)  # its lazy arrays, on this thread (see materialize)
        self.scheduler.draft_model = self.scheduler.rows.draft_model = draft_model

    def load_adapter(self, name: str, path: str) -> None:
        """Load an mlx-lm or PEFT adapter folder as `name`, for requests naming it; between
        model calls (under the turn lock). AdapterError / ModelLoadError name the file."""
        with self.driver.lock:
            self.adapters.load(name, path, busy=self.rows.busy())

    def unload_adapter(self, name: str) -> None:
        """KeyError if unknown; ValueError while a live or queued row uses it."""
        with self.driver.lock:
            self.adapters.unload(name)

    def set_kv_budget(self, budget: int | None) -> None:
        """A new KV budget (a server's --memory-budget after an adapter load or unload)."""
        self.kv_budget = self.admission.kv_budget = budget

    def adapter_names(self) -> list[str]:
        return self.adapters.names()

    def adapter_bytes(self, name: str) -> int:
        return self.adapters.nbytes(name)

    def submit_driven(self, req: GenerationRequest) -> RequestHandle:
        """Submit `req`; read it with `drive`. If the engine is idle and this is the main
        thread, this thread will run the turns while its row is alone."""
        handle = RequestHandle()
        self.driver.claim(handle, self.config.serial_fast_path)
        try:
            self._submit([req], [handle])
        except BaseException:
            self.driver.release(handle)
            raise
        if self.driver.handle is handle:
            with self.driver.lock:  # paths are counted under the turn lock
                self.paths["driven"] += 1
        return handle

    def drive(self, handle: RequestHandle) -> Iterator[TokenEvent]:
        """`handle`'s token events, made on this thread while its row is alone (driver.py)."""
        return self.driver.drive(handle)

    def _submit(
        self,
        reqs: list[GenerationRequest],
        handles: list[RequestHandle],
        arrival: Ticket | None = None,
    ) -> list[RequestHandle]:
        for req in reqs:
            validate(req, self.model)
            self.adapters.check(req)
            if drafts(req) and (req.n > 1 or self.scheduler.draft_model is None):
                raise ValueError("draft speculation needs the engine's draft model and n == 1")
            if (why := refusal(self.model, req)) is not None:
                raise ValueError(why)
            if model_drafts(req) and (why := draft_refusal(self.scheduler.draft_model, self.model)):
                raise ValueError(f"batched draft-model speculation: {why}")
            if drafts_in_batch(req) and (why := batchable(req, self.config)) is not None:
                raise ValueError(f"speculative decoding runs in the batched step, and {why}")
            if req.kv_bits is not None:
                self.announce_scheme(req.kv_bits, req.kv_group_size)
            self.admission.check(req)
            prepare(req)
            materialize(req.prompt, req.input_embeddings, req.prompt_cache)
        if arrival is not None:  # released before it queues: a wave never waits for itself
            for handle in handles:
                handle.arrived = arrival.came_at
            arrival.release()
        self.adapters.acquire(reqs, handles)  # counted until each row's DoneEvent is put
        try:
            self.admission.push(list(zip(reqs, handles, strict=True)))
        except BaseException:
            for handle in handles:
                handle.run_on_done()  # never queued: its adapter's count goes back
            raise
        return handles

    @property
    def alive(self) -> bool:
        """The engine thread is running and accepting work."""
        return not self._stopped.is_set() and not self.admission.closed

    def close(self) -> None:
        self.admission.close()
        if threading.current_thread() is not self._thread:
            self._stopped.wait(timeout=30)

    # stats, from any thread
    def stats(self) -> dict[str, Any]:
        """Rows, throughput over the engine's busy time, reserved KV, and the paths taken."""
        with self.admission.wake:
            active = self.rows.active()
            tokens = self.rows.tokens
            return {
                "active": len(active),
                "waiting": len(self.admission.waiting),
                "tokens_generated": tokens,
                "tokens_per_s": tokens / self._busy_s if self._busy_s > 0 else 0.0,
                "kv_bytes_reserved": self.admission.reserved({id(h) for h in active}),
                "kv_budget": self.kv_budget,
                "kv_bytes_per_token": self.kv_bytes_per_token(),
                "paths": dict(self.paths),
            }

    def rows_snapshot(self) -> list[dict[str, Any]]:
        """Each running row and waiting request, as plain values (snapshot.py)."""
        return rows_snapshot(self)

    def announce_scheme(self, bits: int, group_size: int) -> None:
        """A KV scheme to report in stats before any request uses it (a server's --kv-bits)."""
        self._kv_schemes.add((bits, group_size))

    def kv_bytes_per_token(self) -> dict[str, float]:
        """What one token of context costs in the growing KV layers, unquantized and under each
        KV scheme requests have used (`4bit-g64`, ...)."""
        out = {"unquantized": self.kv_cost.token_bytes()}
        for bits, group in sorted(self._kv_schemes):
            out[f"{bits}bit-g{group}"] = self.kv_cost.token_bytes(bits, group)
        return out

    # the engine thread (or a driver's, under the turn lock)
    def _loop(self) -> None:
        while True:
            self.driver.await_turn(self.scheduler.hold, self.trace.idle)
            with self.driver.lock:
                self.driver.take_back()  # a row a driver left ready is this thread's now
                if not self._turn():
                    return

    def _turn(self, only: RequestHandle | None = None) -> bool:
        """Schedule, run one unit of each kind of row, hand out the events. `only`: a driver's
        turn admits just its own request. False once the engine has shut down."""
        trace, rows = self.trace, self.rows
        try:
            trace.begin()
            if only is not None or self.admission.waiting:
                rows.settle()  # joiners' stores and merges evaluate on this thread
            joiners = self.scheduler.take(only)
            if joiners:
                trace.admitted([handle for _, handle in joiners])
                self.scheduler.start(joiners, self.driver.handle)
            if self.admission.closed:
                rows.release_held()
                for handle in rows.drop_all() + self.admission.drain():
                    handle.put(DoneEvent("cancelled"))
                trace.close()
                return False
            tic = time.perf_counter()
            trace.mark("admit")
            self._run(rows)
            self._busy_s += time.perf_counter() - tic
            trace.end(rows.active, len(self.admission.waiting), rows.paths)
            self.kernels.turn(sum(len(b) for b in rows.batches.values()))
        except Exception as e:  # noqa: BLE001 - the loop must outlive any one turn's failure
            log.exception("engine turn failed; its rows end with the error")
            rows.release_held()
            handles = rows.drop_all()  # the running rows end; the queue keeps waiting
            if self.sharing is not None:
                self.sharing.reset()
            repair_key()
            mx.clear_cache()  # before the callers hear of it (see rows.py: _clear_due)
            for handle in handles:
                handle.put(DoneEvent("error", e))
        return True

    def _run(self, rows: Rows) -> None:
        trace = self.trace
        if not rows.decode_only():
            rows.release_held()  # a prefill or a serial row comes before the next step
            rows.settle()
        if rows.forks:
            rows.fork_turn()
            trace.mark("fork")
        if rows.serial is not None:
            rows.serial_turn()
            trace.mark("serial")
        if rows.batches:
            trace.batches(rows.batches, before=True)
            rows.batch_turns(waiting=bool(self.admission.waiting))
            trace.batches(rows.batches, before=False)
            trace.mark("batch")
        if self.sharing is not None:
            if self.sharing.store.ssd is not None:
                rows.settle()  # a demotion reads entries on this thread
            self.sharing.tick()
            trace.mark("tick")
