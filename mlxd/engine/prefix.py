"""The engine's side of the prefix store: a row starts from the longest stored prefix of its
prompt, snapshots its cache at prompt boundaries, and hands its whole cache back when it ends.

A prompt with images is keyed by its `cache_key` (each image's patch tokens as negative ids from
its pixels' digest): the same picture at the same place hits, another one stops the match at
its first patch, and no cut falls inside an image's tokens.

A request whose prompt shares a long prefix with a row that is about to snapshot it waits for
that snapshot instead of computing the same tokens again (one prefill for a shared prefix).
"""

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..store import PrefixStore
from ..store.ram import common_prefix
from .request import GenerationRequest

log = logging.getLogger("mlxd.store")
SHARE_MIN = 64  # a shared prefix shorter than this is cheaper to recompute than to wait for


@dataclass
class Plan:
    """How a row starts: a clone of a stored prefix (or nothing) and where it snapshots."""

    namespace: str
    cache: list[Any] | None = None
    start: int = 0  # prompt tokens already in `cache`
    cuts: list[tuple[int, str]] = field(default_factory=list)  # (position, kind), ascending


def cuts_for(req: GenerationRequest, start: int = 0, grid: int = 0) -> list[tuple[int, str]]:
    """Where the prefill stops to snapshot: the request's boundaries (mlx_lm.server's segments,
    e.g. the end of the system prompt) and the prompt minus its last token, the point a
    re-rendered next turn always shares. On a deterministic grid, only grid points."""
    n = len(req.prompt)
    cuts = {c: k for c, k in req.snapshot_at if 0 < c < n - 1}
    cuts[n - 1] = "user"
    key = prompt_ids(req) if req.cache_key is not None else None
    if grid or key is not None:
        cuts = {clear_of_media(key, c, grid): k for c, k in sorted(cuts.items())}
    return sorted((c, k) for c, k in cuts.items() if c > start)


def clear_of_media(key: np.ndarray | None, at: int, grid: int = 0) -> int:
    """`at` moved back (to a grid point, on a grid) until it falls outside every image's patch
    tokens: a cache holding part of an image serves no prompt."""
    while True:
        if grid:
            at = at // grid * grid
        if key is None or not 0 < at < len(key) or key[at - 1] >= 0 or key[at] >= 0:
            return at
        at -= 1


@dataclass
class _Pending:
    namespace: str
    prompt: np.ndarray
    cuts: list[int]


class PrefixSharing:
    def __init__(self, store: PrefixStore, namespace: str, share_min: int = SHARE_MIN) -> None:
        self.store, self.base, self.share_min = store, namespace, share_min
        self._pending: dict[int, _Pending] = {}  # id(req) -> its snapshots still to come
        self._version = 0
        self._defer_cache: dict[int, tuple[int, int, bool]] = {}

    @property
    def grid(self) -> int:
        return self.store.grid

    def namespace(self, req: GenerationRequest) -> str:
        """The model (and adapter) plus the request's KV scheme: entries never cross schemes."""
        scheme = f"kv{req.kv_bits}g{req.kv_group_size}s{req.quantized_kv_start}w{req.max_kv_size}"
        if req.kv_config is not None:
            scheme += f"|{req.kv_config.key}"
        if req.adapter is not None and req.adapter_slots is not None:  # its name and content
            scheme += f"|lora:{req.adapter_slots.key(req.adapter)}"
        if req.input_embeddings is not None:
            # A row fed embeddings (and Qwen-VL's mrope positions) shares no entry with text rows,
            # whose same tokens a vision model computes another way (its own positions).
            scheme += "|embeddings"
        return f"{self.base}|{scheme}"

    @staticmethod
    def eligible(req: GenerationRequest) -> bool:
        """Rows with input embeddings only with a key that names them (images' digests)."""
        keyed = req.input_embeddings is None or req.cache_key is not None
        return req.use_prefix_store and req.prompt_cache is None and keyed

    def leads(self, req: GenerationRequest) -> bool:
        """Worth starting ahead of a held wave: the store lacks a prefill step or more of the
        prompt, and a boundary it brings (a system prompt's end) lies far enough past what the
        store has, so turns on their way that share it can wait for that snapshot (`defer`).
        Without such a cut they could not, and would prefill the shared part again."""
        if not self.eligible(req):
            return False
        try:
            have = self.store.peek(self.namespace(req), prompt_ids(req))
        except Exception:  # noqa: BLE001 - a failed peek: held with the wave, as before
            log.exception("prefix store peek failed")
            return False
        if len(req.prompt) - have < req.prefill_step_size:
            return False
        return any(c - have >= self.share_min for c, _ in req.snapshot_at)

    def plan(self, req: GenerationRequest) -> Plan:
        """Look the prompt up; the clone it returns is the row's to write."""
        ns = self.namespace(req)
        try:
            key = prompt_ids(req)
            hit = self.store.lookup(ns, key)
            if hit is not None and (at := clear_of_media(key, hit.length)) < hit.length:
                hit = self.store.lookup(ns, key[: at + 1]) if at else None  # before the image
        except Exception:  # noqa: BLE001 - a store failure costs a miss, never the row
            log.exception("prefix store lookup failed; the row prefills its whole prompt")
            hit = None
        plan = Plan(ns, hit.cache, hit.length) if hit is not None else Plan(ns)
        plan.cuts = cuts_for(req, plan.start, self.grid)
        req.cached_tokens = plan.start
        self.announce(req, plan)
        return plan

    # snapshots still to come, which waiting requests may wait for
    def announce(self, req: GenerationRequest, plan: Plan) -> None:
        prompt = prompt_ids(req)
        self._pending[id(req)] = _Pending(plan.namespace, prompt, [c for c, _ in plan.cuts])
        self._version += 1

    def add_cut(self, req: GenerationRequest, plan: Plan, at: int) -> None:
        """One more snapshot for a row that has not started: where others share its prompt."""
        key = prompt_ids(req) if req.cache_key is not None else None
        at = clear_of_media(key, at, self.grid)
        if at <= plan.start or any(c == at for c, _ in plan.cuts):
            return
        if any(0 < at - c < self.share_min for c, _ in plan.cuts if c > plan.start):
            # An earlier snapshot this close releases the waiters first (`defer`), so this one
            # would serve nobody and only split the donor's feed off its wave's (a lone pass).
            return
        plan.cuts = sorted([*plan.cuts, (at, "system")])
        self.announce(req, plan)

    def landed(self, req: GenerationRequest, at: int) -> None:
        if (p := self._pending.get(id(req))) is not None and at in p.cuts:
            p.cuts.remove(at)
            self._version += 1

    def reset(self) -> None:
        """After a failed turn: no row is running, so no snapshot is coming."""
        self._pending.clear()
        self._defer_cache.clear()
        self._version += 1

    def prune(self, live: set[int]) -> None:
        """Drop announcements of rows that ended by any path (ids of the live requests)."""
        gone = [k for k in self._pending if k not in live]
        for k in gone:
            del self._pending[k]
        if gone:
            self._version += 1

    def forget(self, req: GenerationRequest) -> None:
        if self._pending.pop(id(req), None) is not None:
            self._version += 1
        self._defer_cache.pop(id(req), None)

    def donor(
        self, req: GenerationRequest, kept: list[tuple[GenerationRequest, Plan | None]]
    ) -> tuple[GenerationRequest, Plan, int] | None:
        """The first earlier joiner whose prefill will compute a prefix of this prompt that the
        store lacks, long enough to wait for: (it, its plan, the shared length). The prompt is
        read and the store peeked once per request, not once per pair (32 agents arriving
        together made 465 pairs: ~0.3 s of an H200 host's admission)."""
        ns, a, have = self.namespace(req), None, None
        for other, plan in kept:
            if plan is None or plan.namespace != ns:
                continue
            pending = self._pending.get(id(other))
            b = pending.prompt if pending is not None else prompt_ids(other)
            a = prompt_ids(req) if a is None else a
            n = min(common_prefix(a, b), len(a) - 1, len(b) - 1)
            if n <= plan.start:
                continue
            have = self.store.peek(ns, a) if have is None else have
            if n - have >= self.share_min:
                return other, plan, n
        return None

    def defer(self, req: GenerationRequest) -> bool:
        """Wait: a running row will soon snapshot a prefix of this prompt that the store lacks."""
        if not self.eligible(req) or not self._pending:
            return False
        key = (self._version, self.store.version)
        cached = self._defer_cache.get(id(req))
        if cached is not None and cached[:2] == key:
            return cached[2]
        ns = self.namespace(req)
        prompt = prompt_ids(req)
        have = self.store.peek(ns, prompt)
        wait = False
        for p in self._pending.values():
            if p.namespace == ns and p.cuts and p.cuts[-1] - have >= self.share_min:
                shared = min(common_prefix(p.prompt, prompt), len(prompt) - 1)
                wait = wait or any(c <= shared and c - have >= self.share_min for c in p.cuts)
        self._defer_cache[id(req)] = (*key, wait)
        return wait

    # what rows hand back
    def snapshot(
        self, req: GenerationRequest, plan: Plan, at: int, cache: list[Any], solo: bool = True
    ) -> None:
        """The row's cache holds prompt[:at] (a clone of it is handed over). On the grid, only
        a row prefilled alone computed it as a miss would."""
        kind = next((k for c, k in plan.cuts if c == at), "user")
        exact = 0 if self.grid and not solo else -1
        self._insert(plan.namespace, prompt_ids(req)[:at].copy(), cache, kind, exact)
        self.landed(req, at)

    def finish(
        self, req: GenerationRequest, plan: Plan, tokens: list[int], cache: list[Any], solo: bool
    ) -> None:
        """A row's cache at its end, holding `tokens`. Its prompt part was prefilled on the grid
        only for a row prefilled alone."""
        exact = -1
        if self.grid:
            exact = (len(req.prompt) - 1) // self.grid * self.grid if solo else 0
        if req.cache_key is not None:  # the prompt part under its key, the answer as tokens
            tokens = (list(req.cache_key) + list(tokens[len(req.cache_key) :]))[: len(tokens)]
        self._insert(plan.namespace, tokens, cache, "assistant", exact)
        self.forget(req)

    def tick(self) -> None:
        """The store's idle demotion, guarded like every other store call."""
        try:
            self.store.tick()
        except Exception:  # noqa: BLE001 - demotion can wait; the rows cannot
            log.exception("prefix store demotion failed")

    def trim(self, max_bytes: int) -> None:
        try:
            self.store.trim_to(max_bytes)
        except Exception:  # noqa: BLE001 - a trim can wait; the rows cannot
            log.exception("prefix store trim failed")

    def _insert(self, namespace: str, tokens: list[int], cache: list[Any], *args: Any) -> None:
        try:
            self.store.insert(namespace, tokens, cache, *args)
        except Exception:  # noqa: BLE001 - a store failure costs an entry, never the row
            log.exception("prefix store insert failed; the entry is not kept")


def prompt_ids(req: GenerationRequest) -> np.ndarray:
    """The prompt's store key as int32: its `cache_key` when it has one, else its ids, read
    through the array's buffer: a 4k-token prompt's `tolist()` and `np.asarray` of the list cost
    ~0.3 ms, paid several times a joiner at admission (~1 ms a row of a 32-row wave's 31-37 ms
    on the CPU)."""
    if req.cache_key is not None:
        return np.asarray(req.cache_key, dtype=np.int32)
    return np.asarray(req.prompt).reshape(-1).astype(np.int32, copy=False)
