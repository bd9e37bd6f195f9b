"""The models one `mlxd serve` answers for: their names, which are loaded, and when one loads
or unloads (llama.cpp's router, Ollama and LM Studio keep such a pool; here every model runs in
the server's process, each on its own Engine).

The default model (the first --model) loads at start-up; every other configured model loads
on its first request (one load at a time: concurrent first requests wait for it). A model idle
for its ttl (--model-ttl or its models-file `ttl`: no running or queued rows) is unloaded, and
under --memory-budget a load first unloads the least recently used unpinned idle models until
the weights fit. Pinned models never unload. The loading itself is the provider's
(provider.py); this module keeps the bookkeeping."""

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ServeConfig
from .budget import parse_memory
from .errors import APIError
from .pool_specs import ModelSpec, disk_bytes

log = logging.getLogger("mlxd.serve")

LOADED, LOADING, UNLOADED = "loaded", "loading", "unloaded"
RETRY_S = 2  # a row ends within a generation: a busy pool frees room soon


@dataclass
class Entry:
    spec: ModelSpec
    served: Any = None  # provider.Served while loaded
    state: str = UNLOADED
    last_used: float = field(default_factory=time.monotonic)
    disk_bytes: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # its one load at a time

    @property
    def name(self) -> str:
        return self.spec.name

    def size(self) -> int | None:
        """Weights loaded (as the budget counts them), else their files on disk."""
        return self.served.weight_bytes if self.served is not None else self.disk_bytes


class Pool:
    """Entries by name, least recently used first; `load(entry)` is the provider's."""

    def __init__(self, config: ServeConfig, specs: list[ModelSpec], load: Callable) -> None:
        self.config, self._load = config, load
        self.entries: dict[str, Entry] = {}
        self.names: dict[str, str] = {}  # name, alias or path -> the entry's name
        self.unloads: Counter[tuple[str, str]] = Counter()  # (model, reason)
        self.leases: dict[str, int] = {}  # a running job's bytes (serve/jobs), as weights count
        self._lock = threading.Lock()  # the entries and names
        self._loading = threading.Lock()  # one load or eviction at a time
        self.budget = parse_memory(config.memory_budget) if config.memory_budget else None
        for spec in specs:
            self.add(spec)
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if any(self.ttl(e) for e in self.entries.values()) or config.model_ttl:
            self._reaper = threading.Thread(target=self._reap, name="mlxd-pool-ttl", daemon=True)
            self._reaper.start()

    def add(self, spec: ModelSpec) -> Entry:
        with self._lock:
            entry = self.entries[spec.name] = Entry(spec)
            if spec.path is not None:
                try:  # a request's `~nosuchuser`: the resolver's 404 comes when it loads
                    entry.disk_bytes = disk_bytes(Path(spec.path).expanduser())
                except (RuntimeError, OSError, ValueError):
                    entry.disk_bytes = None
            for name in (spec.name, *spec.aliases):
                self.names.setdefault(name, spec.name)
            if spec.path is not None and not spec.requested:
                self.names.setdefault(spec.path, spec.name)
            return entry

    def find(self, name: str | None) -> Entry | None:
        with self._lock:
            key = self.names.get(name) if name is not None else None
            return self.entries.get(key) if key is not None else None

    def remove(self, entry: Entry) -> None:
        with self._lock:
            self.entries.pop(entry.name, None)
            self.names = {k: v for k, v in self.names.items() if v != entry.name}

    def lock_loads(self) -> threading.Lock:
        """Held while a model loads or unloads."""
        return self._loading

    def ttl(self, entry: Entry) -> float | None:
        return entry.spec.ttl if entry.spec.ttl is not None else self.config.model_ttl

    def loaded(self) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries.values() if e.served is not None]

    def acquire(self, entry: Entry) -> Any:
        """The entry's Served, loaded first if it is not (JIT)."""
        entry.last_used = time.monotonic()
        if (served := entry.served) is not None:
            return served
        with entry.lock:  # a second first request waits for the first one's load
            if entry.served is None:
                with self._loading:
                    self._load_entry(entry)
            entry.last_used = time.monotonic()
            return entry.served

    def _load_entry(self, entry: Entry) -> None:
        entry.state = LOADING
        try:
            need = entry.disk_bytes or 0
            self._make_room(entry, need)
            tic = time.perf_counter()
            entry.served = self._load(entry.spec, self.held(entry))
            entry.state = LOADED
        except BaseException:
            entry.state = UNLOADED
            raise
        log.info("model %s loaded: %d bytes of weights in %.2f s", entry.name,
                 entry.served.weight_bytes, time.perf_counter() - tic)  # fmt: skip

    def held(self, but: Entry | None = None) -> int:
        """Bytes of weights the loaded models hold (all but `but`), and the jobs' leases."""
        weights = sum(e.served.weight_bytes for e in self.loaded() if e is not but)
        return weights + sum(self.leases.values())

    def lease(self, key: str, need: int) -> "int | APIError | None":
        """A job's memory from the same budget: the bytes granted (0 without --memory-budget),
        None while busy models hold the room (ask again), an APIError when it can never fit.
        Idle unpinned models are unloaded to make room, as for a load."""
        if self.budget is None:
            self.leases[key] = 0
            return 0
        with self._loading:
            try:
                self._make_room(Entry(ModelSpec(f"job {key}", None)), need)
            except APIError as e:
                return None if e.status == 503 else e
            self.leases[key] = need
            return need

    def release(self, key: str) -> None:
        self.leases.pop(key, None)

    def _make_room(self, entry: Entry, need: int) -> None:
        """--memory-budget: unload the least recently used unpinned idle models until `need`
        more bytes of weights fit (the budget's working-memory headroom kept)."""
        if self.budget is None:
            return
        headroom = max(self.budget // 16, 256 << 20)
        room = self.budget - headroom
        pinned = sum(e.size() or 0 for e in self.loaded() if e.spec.pinned and e is not entry)
        if pinned + need >= room:
            raise APIError(400, f"model {entry.name!r} ({need} bytes of weights) can never fit "
                           f"--memory-budget {self.config.memory_budget} beside the pinned "
                           f"models ({pinned} bytes) and working memory ({headroom})",
                           param="model", code="model_too_large")  # fmt: skip
        victims = sorted((e for e in self.loaded() if e is not entry and not e.spec.pinned),
                         key=lambda e: e.last_used)  # fmt: skip
        for old in victims:
            if self.held(entry) + need < room:
                return
            if busy(old.served):
                continue
            self.unload(old, "budget", why=f"to make room for {entry.name}")
        if self.held(entry) + need >= room:
            raise APIError(503, f"model {entry.name!r} does not fit --memory-budget "
                           f"{self.config.memory_budget} while the loaded models run rows",
                           headers={"Retry-After": str(RETRY_S)})  # fmt: skip

    def unload(self, entry: Entry, reason: str, why: str = "") -> None:
        """Close its engine and store (a row that raced here ends as cancelled)."""
        served, entry.served, entry.state = entry.served, None, UNLOADED
        if served is None:
            return
        entry.disk_bytes = entry.disk_bytes or served.weight_bytes
        served.engine.close()
        if (sharing := served.engine.sharing) is not None and not sharing.store.closed:
            sharing.store.close()
        self.unloads[(entry.name, reason)] += 1
        log.info("model %s unloaded (%s%s)", entry.name, reason, f": {why}" if why else "")

    def _reap(self) -> None:
        """The TTL: idle (no running or queued rows) for its ttl since its last use."""
        ttls = [t for e in self.entries.values() if (t := self.ttl(e))]
        period = min(max(min(ttls, default=1.0) / 4, 0.1), 5.0)
        while not self._stop.wait(period):
            now = time.monotonic()
            for entry in self.loaded():
                ttl = self.ttl(entry)
                if entry.spec.pinned or ttl is None or entry.served is None:
                    continue
                if busy(entry.served):
                    entry.last_used = now  # idle time counts from its rows' end
                elif now - entry.last_used >= ttl and self._loading.acquire(blocking=False):
                    try:
                        if entry.served is not None and not busy(entry.served):
                            self.unload(entry, "ttl", why=f"idle for {ttl:g} s")
                    finally:
                        self._loading.release()

    def close(self) -> None:
        self._stop.set()
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=10)


def busy(served: Any) -> bool:
    stats = served.engine.stats()
    return bool(stats["active"] or stats["waiting"])
