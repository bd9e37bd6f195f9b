"""A batched row's state (what BatchedRows, batch.py, holds per row), mlx-lm's rule for which
requests may join the batch at all, and the per-uid lookups the batched step reads."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.models.cache import QuantizedKVCache

from ..config import EngineConfig
from .draft_row import drafts
from .output import RowOutput
from .prefix import Plan
from .request import GenerationRequest, RequestHandle, Speculation
from .sampling import Key, KeyedSampler


@dataclass
class BatchedRow:
    req: GenerationRequest
    handle: RequestHandle
    out: RowOutput
    key: Key | None = None  # the row's own PRNG stream (seeded, known draws per token)
    uid: int = -1
    generated: list[int] = field(default_factory=list)

    keyed: KeyedSampler | None = None
    plan: Plan | None = None  # the prefix store's plan for this row
    cuts: list[int] = field(default_factory=list)  # snapshot positions still ahead of it
    offset: int = 0  # tokens in its cache when it was inserted
    processors: list[Any] | None = None  # its own, when siblings of one request need twins
    # the model's per-row state a row that ran alone brings (a vision row's mrope delta,
    # model/vision/model.py): the batch's calls pass each row's, in row order
    model_state: Any = None

    def sampler(self):
        if self.key is None or self.req.draws is None or self.req.sampler is None:
            return self.req.sampler  # unseeded: the engine thread's shared key, as mlx-lm
        self.keyed = KeyedSampler(self.req.sampler, self.key, self.req.draws)
        return self.keyed

    def current_key(self) -> Key | None:
        return self.keyed.key if self.keyed is not None else None


def batchable(req: GenerationRequest, config: EngineConfig) -> str | None:
    """None when the request can share the batched step, else the reason it runs alone.
    mlx-lm's rule: a row is batchable when every one of its cache layers can merge. A row with
    input embeddings prefills alone, then decodes in the batch (moves.needs_own_prefill)."""
    if drafts(req):
        return "a draft-model request runs one row at a time"
    if req.max_kv_size != config.max_kv_size:
        return "a max_kv_size other than the engine's runs one row at a time"
    if req.prompt_cache is not None and not all(_merges(c) for c in req.prompt_cache):
        return "a prompt_cache with layers that cannot merge runs one row at a time"
    return None


def _merges(layer: Any) -> bool:
    return hasattr(layer, "merge") or type(layer) is QuantizedKVCache  # see kv.mergeable


def wants_of(rows: dict[int, BatchedRow]) -> Callable[[int], tuple[bool, int] | None]:
    """A row's (logprob?, top k) when it asked for logprob figures. It closes over the rows
    only: a bound method would tie the step to BatchedRows in a cycle, and the batch's caches
    would wait for the garbage collector instead of going when it closes."""

    def lookup(uid: int) -> tuple[bool, int] | None:
        row = rows.get(uid)
        if row is None or (not row.req.logprob and row.req.top_logprobs <= 0):
            return None
        return row.req.logprob, row.req.top_logprobs

    return lookup


def speculation_of(rows: dict[int, BatchedRow]) -> Callable[[int], Speculation | None]:
    """A row's Speculation by uid (a closure over the rows only, as `wants_of`)."""

    def lookup(uid: int) -> Speculation | None:
        row = rows.get(uid)
        return row.req.speculation if row is not None else None

    return lookup
