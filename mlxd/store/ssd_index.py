"""The SSD tier's in-memory index: which entries are on disk, their sizes and last use (LRU),
and prefix matching of a prompt against them. Thread-safe: the writer adds, the engine reads."""

import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SSDEntry:
    key: str  # hex content key: sha256 over (namespace, FORMAT_VERSION, token ids)
    namespace: str  # opaque string from the caller: model fingerprint + KV scheme + adapter
    tokens: tuple[int, ...]
    kind: str  # "system" | "user" | "assistant" (mlx-lm's cache types), kept for stats
    nbytes: int  # file size
    trimmable: bool  # all layers is_trimmable() when written


@dataclass
class _Record:
    entry: SSDEntry
    tokens: np.ndarray  # int64 copy of entry.tokens, for vectorised compares
    last_used: int  # ns since the epoch; mirrored in the file's mtime so restarts keep order
    seq: int  # insertion order, breaks ties between equal timestamps


def usable(entry_tokens: np.ndarray, trimmable: bool, prompt: np.ndarray) -> int:
    """Tokens of `prompt` an entry can serve: all of it when it is a prefix of the prompt,
    else (only when it can be trimmed) the common prefix."""
    n = min(len(entry_tokens), len(prompt))
    diff = np.flatnonzero(entry_tokens[:n] != prompt[:n])
    common = int(diff[0]) if diff.size else n
    if common == len(entry_tokens):
        return common
    return common if trimmable else 0


class Index:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_ns: dict[str, dict[str, _Record]] = {}
        self._records: dict[str, _Record] = {}
        self._seq = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def add(self, entry: SSDEntry, last_used: int) -> None:
        with self._lock:
            self._remove(entry.key)
            self._seq += 1
            rec = _Record(entry, np.asarray(entry.tokens, dtype=np.int64), last_used, self._seq)
            self._records[entry.key] = rec
            self._by_ns.setdefault(entry.namespace, {})[entry.key] = rec
            self.nbytes += entry.nbytes

    def remove(self, key: str) -> SSDEntry | None:
        with self._lock:
            return self._remove(key)

    def _remove(self, key: str) -> SSDEntry | None:
        rec = self._records.pop(key, None)
        if rec is None:
            return None
        ns = self._by_ns[rec.entry.namespace]
        del ns[key]
        if not ns:
            del self._by_ns[rec.entry.namespace]
        self.nbytes -= rec.entry.nbytes
        return rec.entry

    def touch(self, key: str, now: int) -> bool:
        with self._lock:
            rec = self._records.get(key)
            if rec is not None:
                self._seq += 1
                rec.last_used, rec.seq = now, self._seq
            return rec is not None

    def entries(self) -> list[SSDEntry]:
        with self._lock:
            return [r.entry for r in self._records.values()]

    def lru_victims(self, max_bytes: int) -> list[SSDEntry]:
        """Remove and return the least recently used entries until the total fits `max_bytes`."""
        with self._lock:
            if self.nbytes <= max_bytes:
                return []
            order = sorted(self._records.values(), key=lambda r: (r.last_used, r.seq))
            out = []
            for rec in order:
                if self.nbytes <= max_bytes:
                    break
                out.append(self._remove(rec.entry.key))
            return out

    def match(self, namespace: str, tokens: np.ndarray) -> tuple[SSDEntry, int] | None:
        """The entry serving the most tokens; ties go to one needing no trim, then the smaller."""
        with self._lock:
            records = list(self._by_ns.get(namespace, {}).values())
        best, best_rank = None, (0, False, 0)
        for rec in records:
            n = usable(rec.tokens, rec.entry.trimmable, tokens)
            rank = (n, n == len(rec.tokens), -rec.entry.nbytes)
            if n > 0 and rank > best_rank:
                best, best_rank = rec.entry, rank
        return (best, best_rank[0]) if best is not None else None
