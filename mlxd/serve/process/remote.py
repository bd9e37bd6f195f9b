"""The server's handle on a model's engine process: the Engine methods the server calls, each
a message; a dead process fails its rows at once (502) and is started again with backoff."""

import itertools
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import zmq

from ...engine.request import GenerationRequest, RequestHandle, wake
from ..errors import APIError
from . import wire
from .handles import RemoteHandle, error_of
from .incarnation import Gone, Incarnation, exit_reason
from .views import EMPTY_STATS, Admission, Sharing

log = logging.getLogger("mlxd.serve")
RETRY_S = 2  # Retry-After while the engine restarts


class RemoteEngine:
    """`init`: the process's settings (child.py); `name`: the model, for messages."""

    backoff_s = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # by crashes in the last minute
    stats_timeout_s = 5.0

    def __init__(self, init: dict[str, Any], name: str, arrivals: Any) -> None:
        self.init, self.name, self.arrivals = init, name, arrivals
        self.ctx = zmq.Context.instance()
        self.rows: dict[int, RemoteHandle] = {}
        self.calls: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # rows, calls and the current process
        self.closing = False
        self.restarts = 0
        self.down_reason: str | None = "loading"
        self.crashes: list[float] = []  # monotonic times of recent crashes
        self.adapters: dict[str, str] = {}  # loaded adapters, loaded again after a restart
        self.kv_budget: Any = None  # set by set_kv_budget: sent again after a restart
        self.sharing: Sharing | None = None  # set when the process says it has a store
        self.admission = Admission(self)
        self.facts: dict[str, Any] = {}
        self.batch = init["config"].engine.batch
        self._last_stats: dict[str, Any] = {}
        self._ready: Future = Future()
        self.proc = self._start()
        arrivals.listeners.append(self._arrival)

    # the process
    def _start(self) -> Incarnation:
        self._ready = Future()
        return Incarnation(self.ctx, self.init, self._items, self._exited)

    def wait_ready(self, started: Future | None = None) -> None:
        """Block until the process has loaded the model; its load error, raised here.
        `started`: the Ready future of the process a restart started (else the current one)."""
        ready = (started or self._ready).result()
        self.facts, self.batch = ready.facts, ready.batch
        self.sharing = Sharing(self) if ready.store else None
        self.down_reason = None

    def _items(self, proc: Incarnation, items: list[Any]) -> None:
        watchers: list = []
        for item in items:
            if isinstance(item, wire.Reply):
                if (f := self.calls.pop(item.call, None)) is not None:
                    if item.kind is None:
                        f.set_result(item.value)
                    else:
                        f.set_exception(error_of(item.kind, item.message))
            elif isinstance(item, wire.Ready | wire.Failed):
                if isinstance(item, wire.Ready):
                    self._ready.set_result(item)
                else:
                    self._ready.set_exception(error_of(item.kind, item.message))
            elif (h := self.rows.get(item.rid)) is not None:
                if isinstance(item, wire.Done):
                    self.rows.pop(item.rid, None)
                watchers += h.deliver(item)
        if watchers:
            wake(watchers)

    def _exited(self, proc: Incarnation, code: int) -> None:
        """The process ended: its rows and calls fail now; unless closing, it starts again."""
        with self._lock:
            if proc is not self.proc:  # an earlier process's late report
                return
            rows, self.rows = list(self.rows.values()), {}
            calls, self.calls = list(self.calls.values()), {}
        why = "closed" if self.closing else exit_reason(code)
        if not self._ready.done():
            self._ready.set_exception(RuntimeError(f"the engine process ended ({why}) while "
                                                   "loading; its log says why"))  # fmt: skip
        if not self.closing and not self.down_reason:  # a failed restart keeps its own reason
            self.down_reason = f"engine process exited with {why}; restarting"
            log.error("model %s: %s (%d requests ended)", self.name, self.down_reason, len(rows))
        status = 503 if self.closing else 502
        ended = APIError(status, f"model {self.name}: its engine process exited with {why} "
                         "before this request finished", code="engine_died")  # fmt: skip
        watchers: list = []
        for h in rows:
            watchers += h.end(ended)
        if watchers:
            wake(watchers)
        for f in calls:
            f.set_exception(self._unavailable())
        if not self.closing:
            threading.Thread(target=self._restart, daemon=True, name="mlxd-engine-restart").start()

    def _restart(self) -> None:
        """One try, after a backoff that grows with the crashes of the last minute. A try that
        fails ends its process, whose exit (`_exited`) starts the next try."""
        now = time.monotonic()
        self.crashes = [t for t in self.crashes if t > now - 60] + [now]
        time.sleep(self.backoff_s[min(len(self.crashes), len(self.backoff_s)) - 1])
        if self.closing:
            return
        with self._lock:
            self.proc = proc = self._start()
            ready = self._ready
        try:
            self.wait_ready(ready)
            for name, path in self.adapters.items():
                self.call("load_adapter", name, path)
            if self.kv_budget is not None:
                self.call("set_kv_budget", self.kv_budget)
        except Exception as e:  # noqa: BLE001 - ended here: its exit starts the next try
            log.error("model %s: engine restart failed: %s", self.name, e)
            if proc is self.proc:  # not a later try's state
                self.down_reason = f"engine restart failed: {e}; trying again"
            proc.kill()  # this try's process (its exit may have started the next one already)
            return
        self.restarts += 1
        log.info("model %s: engine process restarted (pid %d)", self.name, self.proc.pid)

    def _unavailable(self) -> APIError:
        why = self.down_reason or "not running"
        return APIError(503, f"model {self.name}: its engine is unavailable ({why})",
                        headers={"Retry-After": str(RETRY_S)})  # fmt: skip

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Run `method` in the process; its exception is raised here."""
        f: Future = Future()
        with self._lock:
            if self.down_reason is not None and method != "close":
                raise self._unavailable()
            call = next(self._ids)
            self.calls[call] = f
            proc = self.proc
        try:
            proc.send(wire.Call(call, method, list(args)))
        except Gone:
            self.calls.pop(call, None)
            raise self._unavailable() from None
        try:
            return f.result(timeout)
        except FutureTimeout:
            self.calls.pop(call, None)
            raise TimeoutError(f"model {self.name}: the engine did not answer {method}") from None

    def _arrival(self, kind: str) -> None:
        if self.down_reason is None:
            self._quiet(wire.Arrive(kind))

    def _quiet(self, msg: Any) -> None:
        """Send `msg` if the process takes it (a dead one's rows have ended already)."""
        try:
            self.proc.send(msg)
        except Gone:
            pass

    # the Engine methods the server calls
    def submit(self, req: GenerationRequest, arrival: Any = None) -> RequestHandle:
        return self._submit([req], 1, arrival)[0]

    def submit_many(self, reqs: list[GenerationRequest]) -> list[RequestHandle]:
        return self._submit(reqs, 1, None)

    def submit_n(self, req: GenerationRequest, n: int, arrival: Any = None) -> list[RequestHandle]:
        return self._submit([req], n, arrival)

    def _submit(self, reqs: list[GenerationRequest], n: int, arrival: Any) -> list[RequestHandle]:
        specs = [wire.row_spec(r) for r in reqs]
        f: Future = Future()
        with self._lock:
            if self.down_reason is not None:
                raise self._unavailable()
            handles = [
                RemoteHandle(next(self._ids), self._cancel) for _ in range(max(n, len(reqs)))
            ]
            for h, req in zip(handles, reqs * n if n > 1 else reqs, strict=True):
                h.progress = req.prompt_progress_callback
                self.rows[h.rid] = h
            call = next(self._ids)
            self.calls[call] = f
            proc = self.proc
        if arrival is not None:  # released before it queues, as the engine does (engine.py)
            for h in handles:
                h.arrived = arrival.came_at
            arrival.release()
        try:
            proc.send(wire.Submit(call, [h.rid for h in handles], specs, n))
            f.result()
        except BaseException as e:
            with self._lock:
                self.calls.pop(call, None)
                for h in handles:
                    self.rows.pop(h.rid, None)
            if isinstance(e, Gone):
                raise self._unavailable() from None
            raise
        return handles

    def _cancel(self, rid: int) -> None:
        if rid in self.rows:
            self._quiet(wire.Cancel(rid))

    def stats_all(self) -> dict[str, Any]:
        """The process's engine and store stats (the last ones while it restarts)."""
        try:
            self._last_stats = self.call("stats", timeout=self.stats_timeout_s)
        except Exception:  # noqa: BLE001 - restarting or gone: what it last said, rows zeroed
            engine = dict(self._last_stats.get("engine") or EMPTY_STATS)
            engine.update(active=len(self.rows), waiting=0)
            return {"engine": engine, "store": self._last_stats.get("store")}
        return self._last_stats

    def stats(self) -> dict[str, Any]:
        return self.stats_all()["engine"]

    def rows_snapshot(self) -> list[dict[str, Any]]:
        """The process's rows (engine/snapshot.py); none while it restarts."""
        try:
            return self.call("rows", timeout=self.stats_timeout_s)
        except Exception:  # noqa: BLE001 - restarting or gone
            return []

    @property
    def alive(self) -> bool:
        return self.down_reason is None and not self.closing

    def load_adapter(self, name: str, path: str) -> None:
        self.call("load_adapter", name, path)
        self.adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        self.call("unload_adapter", name)
        self.adapters.pop(name, None)

    def adapter_names(self) -> list[str]:
        return list(self.adapters)

    def adapter_bytes(self, name: str) -> int:
        return int(self.call("adapters", timeout=self.stats_timeout_s).get(name, 0))

    def set_kv_budget(self, budget: int | None) -> None:
        self.call("set_kv_budget", budget)
        self.kv_budget = budget

    def embed(
        self, ids: list[list[int]], pooling: str, dimensions: int | None
    ) -> list[list[float]]:
        return self.call("embed", ids, pooling, dimensions)

    def close(self) -> None:
        """Close the engine and its store in the process, then end it (killed if it hangs)."""
        if self.closing:
            return
        try:
            self.arrivals.listeners.remove(self._arrival)
        except ValueError:
            pass
        alive = self.down_reason is None
        self.closing = True
        if alive:
            try:
                self.call("close", timeout=30)
            except Exception as e:  # noqa: BLE001 - it is ended below either way
                log.warning("model %s: engine close: %s", self.name, e)
        if not self.proc.wait(10):
            self.proc.kill()
            self.proc.wait(10)
