"""The RAM tier: prompt caches keyed by (namespace, token prefix), under a byte cap and an entry
cap. Eviction is least-recently-used with mlx-lm's LRUPromptCache preference between kinds
(assistant before user before system, unless a kind has fewer entries than the next)."""

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("assistant", "user", "system")  # eviction preference, mlx-lm's CacheOrder


@dataclass(eq=False)
class Entry:
    namespace: str
    tokens: np.ndarray  # int32, exactly the tokens in `cache`
    cache: list[Any]
    nbytes: int
    kind: str = "assistant"
    trimmable: bool = True
    exact: int = -1  # leading tokens prefilled on the deterministic grid (-1: all of them)
    last_used: float = field(default_factory=time.monotonic)
    on_disk: bool = False  # the SSD tier holds a copy

    def __post_init__(self) -> None:
        if self.exact < 0:
            self.exact = len(self.tokens)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    eq = a[:m] == b[:m]
    return m if bool(eq.all()) else int(np.argmin(eq))


def usable(entry: Entry, tokens: np.ndarray, limit: int, grid: int) -> int:
    """How many leading tokens of `tokens` this entry can serve (at most `limit`). A prefix entry
    serves itself; a longer or diverging one only when its layers can be trimmed back. With a
    grid (deterministic mode) only grid-aligned, grid-prefilled tokens count."""
    n = len(entry.tokens)
    c = min(common_prefix(entry.tokens, tokens), limit)
    if grid:
        c = min(c, entry.exact) // grid * grid
    if c < n and not entry.trimmable:
        return 0
    return c


class RAMTier:
    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: dict[str, list[Entry]] = collections.defaultdict(list)
        self._lru: dict[str, collections.OrderedDict[int, Entry]] = {
            k: collections.OrderedDict() for k in KINDS
        }
        self.nbytes = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._lru.values())

    def entries(self) -> list[Entry]:
        return [e for q in self._lru.values() for e in q.values()]

    def match(
        self, namespace: str, tokens: np.ndarray, limit: int, grid: int = 0
    ) -> tuple[Entry, int] | None:
        """The entry serving the most leading tokens; ties go to the one needing no trim."""
        best: tuple[Entry, int] | None = None
        for e in self._entries.get(namespace, ()):
            n = usable(e, tokens, limit, grid)
            if n > 0 and (best is None or (n, -len(e.tokens)) > (best[1], -len(best[0].tokens))):
                best = (e, n)
        return best

    def find(self, namespace: str, tokens: np.ndarray) -> Entry | None:
        """The entry for exactly these tokens."""
        for e in self._entries.get(namespace, ()):
            if len(e.tokens) == len(tokens) and bool((e.tokens == tokens).all()):
                return e
        return None

    def touch(self, entry: Entry) -> None:
        entry.last_used = time.monotonic()
        self._lru[entry.kind].move_to_end(id(entry))

    def insert(self, entry: Entry) -> list[Entry]:
        """Add `entry` (replacing one with the same tokens, dropping the prefixes it
        supersedes); returns the entries evicted to make room (or `entry`, if it cannot fit)."""
        if entry.nbytes > self.max_bytes or self.max_entries <= 0:
            return [entry]
        if (old := self.find(entry.namespace, entry.tokens)) is not None:
            self.remove(old)
        if entry.trimmable:  # a trimmable entry serves every prefix of itself (mlx-lm drops them)
            for e in list(self._entries.get(entry.namespace, ())):
                n = len(e.tokens)
                if n < len(entry.tokens) and e.exact <= entry.exact:
                    if bool((entry.tokens[:n] == e.tokens).all()):
                        self.remove(e)
        self._entries[entry.namespace].append(entry)
        self._lru[entry.kind][id(entry)] = entry
        self.nbytes += entry.nbytes
        return self.trim_to(self.max_bytes, self.max_entries)

    def remove(self, entry: Entry) -> Entry:
        self._entries[entry.namespace].remove(entry)
        del self._lru[entry.kind][id(entry)]
        self.nbytes -= entry.nbytes
        return entry

    def _victim(self) -> Entry:
        """mlx-lm's CacheOrder.pop: the oldest of a kind, preferring assistant, then user."""
        queues = [self._lru[k] for k in KINDS]
        for a, b in zip(queues, queues[1:], strict=False):
            if a and len(a) >= len(b):
                return next(iter(a.values()))
        return next(iter(next(q for q in reversed(queues) if q).values()))

    def trim_to(self, max_bytes: int, max_entries: int | None = None) -> list[Entry]:
        """Evict until the tier holds at most `max_bytes` (and `max_entries`)."""
        cap = self.max_entries if max_entries is None else max_entries
        gone = []
        while len(self) and (self.nbytes > max_bytes or len(self) > cap):
            gone.append(self.remove(self._victim()))
        return gone

    def idle(self, seconds: float) -> list[Entry]:
        now = time.monotonic()
        return [e for e in self.entries() if now - e.last_used >= seconds]
