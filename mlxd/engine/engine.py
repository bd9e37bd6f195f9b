"""The Engine: one thread owns all MLX work; callers submit requests and read events.

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
import weakref
from dataclasses import replace
from typing import Any

# mlx-lm's thread-local generation stream: each thread that enters it gets its own stream.
from ..model.folded_attention import is_folded
from ..model.folded_attention import unsupported as unfoldable
from ..model.plain_rows import PlainRowsTwin
from .admission import Admission, Overloaded
from .arrivals import Arrivals, Ticket
from .batch import BatchedRows
from .batch_row import BatchConfig, batchable
from .drive import Driving
from .fork import ForkJob
from .handle import RequestHandle
from .kernel_window import KernelWindow
from .kv_budget import KVCost
from .materialize import materialize
from .moves import Serial, drain_keeps_bits
from .output import prepare
from .prefix import PrefixSharing
from .prefix_rows import PrefixRows
from .request import DoneEvent, GenerationRequest
from .rng import KeyOwner, repair_key
from .routing import Routing
from .serial import validate
from .stats import EngineStats
from .threads import run_on_worker
from .trace import Trace
from .turns import Turns

__all__ = ["Engine", "Overloaded"]

_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()
log = logging.getLogger("mlxd.engine")


@atexit.register
def _close_all() -> None:
    # An engine thread still inside MLX at interpreter exit aborts the process: stop them first.
    for engine in list(_live):
        engine.close()


class Engine(PrefixRows, Routing, Turns, Driving, EngineStats):
    """Submit requests from any thread; all MLX work happens on the engine's own thread."""

    def __init__(
        self,
        model: Any,
        batch: int = 8,
        max_queue: int = 1024,
        prefill_step_size: int = 2048,
        weak_model: bool = False,
        tokenizer: Any | None = None,
        kv_budget: int | None = None,
        batch_config: BatchConfig | None = None,
        serial_fast_path: bool = True,
        prefix_store: Any = None,
        namespace: str = "",
        arrivals: Arrivals | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        # weak_model: the Python API's engines must not keep a dropped model alive.
        self._model = weakref.ref(model) if weak_model else (lambda: model)
        materialize(model)
        self.batch = batch
        self.config = batch_config or BatchConfig(batch, min(batch, 8), prefill_step_size)
        self._kernels = KernelWindow.from_env()  # MLXD_KERNELS=FILE: GPU time; else a no-op
        if isinstance(self._kernels, KernelWindow):  # the window times the step's host parts too
            self.config = replace(self.config, clock=self._kernels.clock)
            self._kernels.order = self.config.step_order
        mode = self.config.attention
        if is_folded(mode) and (why := unfoldable(model, mode)) is not None:
            raise ValueError(why)
        # serial_fast_path: a lone row runs serial caches, and a batch's last row returns to them
        # where that keeps its bits (moves.py). Off: every row runs BatchGenerator's step.
        self.serial_fast_path = serial_fast_path
        self.drain_to_serial = serial_fast_path and drain_keeps_bits(self.config.attention)
        self.tokenizer = tokenizer  # when given, token events carry text deltas
        self.kv_budget = kv_budget
        self.last_batch_stats: Any = None  # mlx-lm BatchStats of the last finished batch
        self.last_batch_key: tuple[int, int] | None = None  # the PRNG key it ended with
        self.admission = Admission(batch, max_queue, kv_budget, model, self.config)
        # arrivals: a server's requests on their way; a new wave waits for them up to its
        # window (arrivals.py), so turns that arrive together prefill together. None: off.
        self.arrivals = arrivals or Arrivals(0.0)
        self.arrivals.attach(self.admission.wake)
        # Bytes per token per KV scheme, for stats (probed here: the engine thread is not up).
        self.kv_cost = self.admission.kv_cost or KVCost.probe(model)
        self._kv_schemes: set[tuple[int, int]] = set()  # (bits, group) of requests seen
        # The prefix store (layer 0), keyed by `namespace`: the model, its adapter, ...
        self.sharing = PrefixSharing(prefix_store, namespace) if prefix_store is not None else None
        self._serial: Serial | None = None
        self._plain_rows = PlainRowsTwin()  # what step_model() hands out
        self._alone = False  # the serial row cannot share the batched step
        self._batches: dict[Any, BatchedRows] = {}  # by KV format (None: unquantized)
        self._forks: list[ForkJob] = []  # n > 1 prompts being prefilled once
        self._groups: dict[int, list[RequestHandle]] = {}  # first handle -> its siblings
        self.paths: collections.Counter[str] = collections.Counter()
        self._tokens, self._busy_s = 0, 0.0
        self._keys = KeyOwner()
        self._stopped = threading.Event()
        self._trace = Trace.from_env()  # MLXD_TRACE=FILE: a line per turn; else a no-op
        self._init_driving()
        self._thread = run_on_worker(self._loop, self._stopped)
        _live.add(self)

    @property
    def model(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this engine was garbage-collected")
        return model

    def submit(self, req: GenerationRequest, arrival: Ticket | None = None) -> RequestHandle:
        """`arrival`: the request's ticket from a server's `arrivals`, released as it queues."""
        return self._submit([req], [RequestHandle()], arrival)[0]

    def submit_many(self, reqs: list[GenerationRequest]) -> list[RequestHandle]:
        """Submit requests atomically: admitted in one round, they share one batch composition."""
        return self._submit(reqs, [RequestHandle() for _ in reqs])

    def _submit(
        self,
        reqs: list[GenerationRequest],
        handles: list[RequestHandle],
        arrival: Ticket | None = None,
    ) -> list[RequestHandle]:
        for req in reqs:
            validate(req, self.model)
            if req.kv_bits is not None:
                self.announce_scheme(req.kv_bits, req.kv_group_size)
            self.admission.check(req)
            prepare(req)
            materialize(req.prompt, req.input_embeddings, req.prompt_cache)
        if arrival is not None:  # released before it queues: a wave never waits for itself
            for handle in handles:
                handle.arrived = arrival.came_at
            arrival.release()
        self.admission.push(list(zip(reqs, handles, strict=True)))
        return handles

    def submit_n(
        self, req: GenerationRequest, n: int, arrival: Ticket | None = None
    ) -> list[RequestHandle]:
        """`n` rows sampled from one prompt that is prefilled once (OpenAI's `n`). With a
        seed, row i samples from the stream of seed + i."""
        if n < 1:
            raise ValueError("n must be >= 1")
        if n > self.batch:  # it could never be admitted, and would block the queue behind it
            raise ValueError(f"n must be at most {self.batch} (the engine's batch size)")
        if n > 1 and (why := batchable(req, self.config)) is not None:
            raise ValueError(f"n > 1 needs the batched step, and {why}")
        req.n = n
        handles = [RequestHandle() for _ in range(n)]
        self._groups[id(handles[0])] = handles[1:]  # before the engine can see the request
        try:
            self._submit([req], handles[:1], arrival)
        except BaseException:
            self._groups.pop(id(handles[0]), None)
            raise
        return handles

    def _active(self) -> list[RequestHandle]:
        handles = [self._serial[1]] if self._serial else []
        handles += [h for job in self._forks for h in job.handles]
        return handles + [r.handle for b in self._batches.values() for r in b.rows.values()]

    def _running_requests(self) -> list[GenerationRequest]:
        reqs = [self._serial[0].req] if self._serial else []
        reqs += [job.req for job in self._forks]
        return reqs + [r.req for b in self._batches.values() for r in b.rows.values()]

    @property
    def alive(self) -> bool:
        """The engine thread is running and accepting work."""
        return not self._stopped.is_set() and not self.admission.closed

    def close(self) -> None:
        self.admission.close()
        if threading.current_thread() is not self._thread:
            self._stopped.wait(timeout=30)

    # engine thread
    def _admit(self, only: RequestHandle | None = None) -> None:
        """Start waiting requests as rows (`only`: just that one, for a driver)."""
        if only is None and self._hold() > 0:
            return  # requests on their way will join this wave (arrivals.py)
        busy = self._busy()
        defer = None
        if self.sharing is not None and busy and self.admission.waiting:
            self.sharing.prune({id(r) for r in self._running_requests()})
            defer = self.sharing.defer
        joiners = self.admission.take(self._active, self._alone, defer, only)
        if not joiners:
            return
        self._trace.admitted([handle for _, handle in joiners])
        taken = [h for _, handle in joiners for h in [handle, *self._groups.get(id(handle), [])]]
        try:
            self._start(joiners)
        except Exception as e:
            # Taken but not yet rows: nobody else would ever end them (the loop's handler ends
            # the running rows). Ones sent back to wait are still queued.
            live = {id(h) for h in self._active()}
            with self.admission.wake:
                live |= {id(h) for _, h in self.admission.waiting}
            for h in taken:
                if id(h) not in live and h.done is None:
                    h.put(DoneEvent("error", e))
            raise

    def _shutdown(self) -> None:
        handles = self._active() + self.admission.drain()
        handles += [h for group in self._groups.values() for h in group]
        for batch in self._batches.values():
            batch.discard()
        self._serial, self._batches, self._forks = None, {}, []
        for handle in handles:
            handle.put(DoneEvent("cancelled"))

    def _loop(self) -> None:
        while True:
            self._await_turn()  # drive.py: idle, or a caller drives its lone row
            with self._turn_lock:
                self._take_back()  # drive.py: a row a driver left ready is this thread's now
                if not self._turn():
                    return

    def _fail_running(self, error: Exception) -> None:
        """End every running row with `error` and start clean (the queue keeps waiting)."""
        handles = self._active()
        handles += [h for group in self._groups.values() for h in group]
        self._serial, self._alone, self._forks, self._groups = None, False, [], {}
        for batch in self._batches.values():
            batch.discard()
        self._batches = {}
        self._keys = KeyOwner()
        if self.sharing is not None:
            self.sharing.reset()
        repair_key()
        for handle in handles:
            handle.put(DoneEvent("error", error))
