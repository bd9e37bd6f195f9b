"""The prefix store: the RAM tier in front of the optional SSD tier, as the engine uses it.

A hit is a copy-on-write clone; the donor entry stays (agent B reusing agent A's system prompt
leaves A's whole history in place). Entries are written through to the SSD tier in the
background, restored from it when RAM has nothing as long, and idle ones are demoted to it.
Only the engine thread calls in; `stats()` may be read from any thread.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import layers
from .ram import Entry, RAMTier

log = logging.getLogger("mlxd.store")


@dataclass
class Hit:
    cache: list[Any]  # a clone holding the first `length` tokens of the prompt
    length: int
    source: str  # "ram" or "ssd"


def _ema(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else old + weight * (new - old)


class PrefixStore:
    def __init__(
        self,
        max_bytes: int | None = None,
        max_entries: int = 10,
        ssd: Any = None,
        demote_idle_s: float | None = None,
        grid: int = 0,
    ) -> None:
        """`grid` > 0 is the deterministic mode: hits and snapshots only at multiples of it."""
        self.ram = RAMTier(max_bytes if max_bytes is not None else 1 << 62, max_entries)
        self.ssd, self.demote_idle_s, self.grid = ssd, demote_idle_s, grid
        self.counts = {
            "lookups": 0, "hits": 0, "ssd_hits": 0, "hit_tokens": 0, "inserted": 0,
            "ssd_skipped": 0,  # a disk entry that would have restored slower than a prefill
        }  # fmt: skip
        self._last_tick = time.monotonic()
        self.closed = False
        # Measured speeds (exponential averages): the disk tier competes with recomputing.
        self.prefill_tokens_per_s: float | None = None
        self.restore_bytes_per_s: float | None = None
        self.version = 0  # changes whenever what a lookup could return may have changed

    def _best(self, namespace: str, tokens: np.ndarray) -> tuple[Entry | Any, int, str] | None:
        limit = len(tokens) - 1  # at least one token is left to feed
        ram = self.ram.match(namespace, tokens, limit, self.grid)
        best = (ram[0], ram[1], "ram") if ram else None
        if self.ssd is not None and (disk := self.ssd.match(namespace, tokens)) is not None:
            entry, n = disk
            n = min(n, limit)
            if self.grid:
                n = n // self.grid * self.grid
            have = best[1] if best else 0
            ok = n == len(entry.tokens) or entry.trimmable
            if ok and n > have and self._worth(entry, n - have):
                best = (entry, n, "ssd")
        return best

    def _worth(self, entry: Any, gain: int) -> bool:
        """Restore from disk only when it is expected to beat prefilling the `gain` tokens (a
        small model on a fast GPU can recompute 8k tokens faster than it reads their KV)."""
        fill, read = self.prefill_tokens_per_s, self.restore_bytes_per_s
        if fill is None or read is None:
            return True
        if entry.nbytes / read < gain / fill:
            return True
        self.counts["ssd_skipped"] += 1
        return False

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.prefill_tokens_per_s = _ema(self.prefill_tokens_per_s, tokens / seconds)

    def peek(self, namespace: str, tokens: Sequence[int]) -> int:
        """How many leading tokens a lookup would serve (no clone, no disk read)."""
        best = self._best(namespace, np.asarray(tokens, dtype=np.int32))
        return best[1] if best else 0

    def lookup(self, namespace: str, tokens: Sequence[int]) -> Hit | None:
        self.counts["lookups"] += 1
        arr = np.asarray(tokens, dtype=np.int32)
        for _ in range(4):  # a corrupt disk entry is quarantined; then try the next best
            best = self._best(namespace, arr)
            if best is None:
                return None
            entry, n, source = best
            if source == "ssd" and (entry := self._restore(namespace, entry)) is None:
                continue
            if self.ram.find(namespace, entry.tokens) is entry:
                self.ram.touch(entry)
            self.counts["hits"] += 1
            self.counts["ssd_hits"] += source == "ssd"
            self.counts["hit_tokens"] += n
            cache = layers.clone(entry.cache, len(entry.tokens) - n)
            return Hit(layers.compact(cache) if self.grid else cache, n, source)
        return None

    def _restore(self, namespace: str, disk: Any) -> Entry | None:
        tic = time.perf_counter()
        cache = self.ssd.restore(disk)
        if cache is None:  # corrupt: quarantined by the tier, never served
            return None
        rate = disk.nbytes / max(time.perf_counter() - tic, 1e-6)
        self.restore_bytes_per_s = _ema(self.restore_bytes_per_s, rate)
        entry = Entry(namespace, np.asarray(disk.tokens, dtype=np.int32), cache,
                      layers.nbytes(cache), disk.kind, disk.trimmable, on_disk=True)  # fmt: skip
        self._add(entry)  # kept in RAM when it fits; served either way
        return entry

    def insert(
        self,
        namespace: str,
        tokens: Sequence[int],
        cache: list[Any],
        kind: str = "assistant",
        exact: int = -1,
    ) -> None:
        """Keep `cache` (holding exactly `tokens`) for later requests. The caller hands it over:
        it must not write to these layer objects afterwards (a clone may)."""
        arr = np.asarray(tokens, dtype=np.int32)
        if len(arr) == 0:
            return
        layers.evaluate(cache)
        trim = layers.trimmable(cache)
        entry = Entry(namespace, arr, cache, layers.nbytes(cache), kind, trim, exact)
        self.counts["inserted"] += 1
        self._add(entry)
        # Written through for restarts, except a trimmable prompt-boundary snapshot: the row's
        # whole cache follows when it ends and serves it (it still goes to disk if evicted).
        if self.ssd is not None and not entry.on_disk and not (kind == "user" and trim):
            entry.on_disk = self.ssd.submit(namespace, arr.tolist(), cache, kind)

    def _add(self, entry: Entry) -> None:
        self.version += 1
        for gone in self.ram.insert(entry):
            self._demote(gone)

    def _demote(self, entry: Entry) -> None:
        """An entry leaving RAM goes to disk when it is not there yet (its memory is freed once
        the writer is done with it)."""
        if self.ssd is not None and not entry.on_disk:
            entry.on_disk = self.ssd.submit(entry.namespace, entry.tokens.tolist(), entry.cache,
                                             entry.kind)  # fmt: skip

    def trim_to(self, max_bytes: int) -> None:
        self.version += 1
        for gone in self.ram.trim_to(max(0, max_bytes)):
            self._demote(gone)

    def tick(self) -> None:
        """Demote entries idle for `demote_idle_s` (checked at most once a second)."""
        now = time.monotonic()
        if self.demote_idle_s is None or self.ssd is None or now - self._last_tick < 1.0:
            return
        self._last_tick = now
        self.version += 1
        for entry in self.ram.idle(self.demote_idle_s):
            self._demote(entry)
            if entry.on_disk:
                self.ram.remove(entry)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts)
        out.update(ram_entries=len(self.ram), ram_bytes=self.ram.nbytes)
        out["ram_bytes_max"] = self.ram.max_bytes
        if self.ssd is not None:
            out["ssd"] = self.ssd.stats()
        return out

    def close(self) -> None:
        """Wait for the disk writes already queued, then stop the writer."""
        self.closed = True
        if self.ssd is not None:
            self.ssd.close()
