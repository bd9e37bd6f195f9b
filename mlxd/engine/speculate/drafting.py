"""Speculation in the batched step: which rows draft, how wide, and the bookkeeping after.

Each step, every drafting row proposes from what its cache holds (prompt lookup, or the
prediction it was given) or offers the engine's draft model (draft_model.py); the gate
(gate.py) weighs those proposals against the measured cost of a wider step. A plain step keeps
mlx-lm's pipelined GenerationBatch step; a verify step (verify.py) reads the pending tokens,
drafts after them and verifies every row at once. Rows whose caches cannot be cut back
(sliding-window rings, recurrent state) never get here: the engine refuses their speculation
up front (`refusal`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from ...kv.batch_quantized import BatchQuantizedKVCache
from ...kv.batch_roll import RollingBatchKVCache
from ..request import Speculation
from .draft_model import ModelDrafts
from .gate import Acceptance, StepCosts, choose_width
from .ngram import BACK, SIZES, NgramIndex
from .processed import draftable
from .verify import verify

# Batch layers a verify step can cut back per row (trim, then a right-padding roll; a
# sliding window right after its multi-token update, verify.py).
TRIMMABLE = (BatchKVCache, RollingBatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache)
ROW_LAYERS = (KVCache, RotatingKVCache)  # the row caches those batch layers come from
TAIL = BACK + max(SIZES) + 1  # the tokens a lookup reads
MODES = ("ngram", "prediction", "model")  # the modes that draft in the batched step
FORGET = 0.97  # a draft-model row's acceptance drifts back to its prior each step it waits
GIVE_UP = 32  # plain steps in a row with draft-model rows: a lone one may leave for serial


def drafts_in_batch(req: Any) -> bool:
    """The request drafts in the batched step (prompt lookup, a prediction, the draft model)."""
    spec = req.speculation
    return spec is not None and spec.mode in MODES and spec.max_draft > 0


def model_drafts(req: Any) -> bool:
    """The request drafts with the engine's draft model in the batched step."""
    return drafts_in_batch(req) and req.speculation.mode == "model"


def refusal(model: Any, req: Any) -> str | None:
    """Why `req` cannot draft on `model` (None: it can, or it does not ask to): a verify step
    cuts each row's cache back, and sliding-window rings and recurrent state cannot be cut."""
    if not drafts_in_batch(req):
        return None
    cache = make_prompt_cache(model, max_kv_size=req.max_kv_size)
    kinds = sorted({type(c).__name__ for c in cache if type(c) not in ROW_LAYERS})
    if kinds:
        return (
            "speculative decoding needs caches it can cut back, and this model has "
            f"{', '.join(kinds)} layers (recurrent state)"
        )
    quantized = req.kv_bits is not None or req.kv_config is not None
    if quantized and req.quantize_windows and any(type(c) is RotatingKVCache for c in cache):
        return "speculative decoding does not cut back quantized sliding windows"
    return None


@dataclass
class RowDrafter:
    """One drafting row: its tokens indexed, the prediction it follows, its acceptance."""

    spec: Speculation
    own: NgramIndex  # everything in the row's cache and emitted since
    predicted: NgramIndex | None = None  # [-1] + the prediction's tokens
    output: list[int] = field(default_factory=lambda: [-1])  # [-1] + the row's emitted tokens
    acceptance: Acceptance = field(default_factory=Acceptance)
    drafted: int = 0
    accepted: int = 0
    guess: int | None = None  # what its last proposal said the pending token would be

    def propose(self, pending: int | None, k: int) -> list[int]:
        """Up to k tokens after the pending one (or, when it is unknown, starting with it)."""
        if k <= 0:
            return []
        extra = [pending] if pending is not None else []
        if self.predicted is not None:
            got = self.predicted.propose(self.output[-TAIL:] + extra, k)
            if got:
                return got
        return self.own.propose(self.own.tokens[-TAIL:] + extra, k)

    def emit(self, token: int) -> None:
        self.own.extend((token,))
        if self.predicted is not None:
            self.output.append(token)


class Drafting:
    """The drafting rows of one batch, by uid (`lookup`: a uid's Speculation, or None)."""

    def __init__(
        self, lookup: Callable[[int], Speculation | None], draft_model: Callable[[], Any]
    ) -> None:
        self.lookup = lookup
        self.draft_model = draft_model  # the engine's, now (mode "model")
        self.model_drafts: ModelDrafts | None = None
        self.rows: dict[int, RowDrafter] = {}
        self.costs = StepCosts()
        self.known: dict[int, int] = {}  # pending tokens a verify step left on the host
        self.plain: set[int] = set()  # rows that never draft
        self._uids: tuple[int, ...] = ()  # the rows of the last step
        self.plain_streak = 0  # steps since the gate last chose to verify (drafting rows there)

    def next(self, batch: Any, plain: Callable[[], list[Any]], kinds: list[tuple]) -> list[Any]:
        """One step of `batch`: plain (`plain()`, GenerationBatch.next) or a verify step."""
        eligible = self._eligible(batch)
        rows = len(batch.uids)
        if tuple(batch.uids) != self._uids:  # rows joined or left (or it idled): no sample
            self._uids = tuple(batch.uids)
            self.costs.pause()
        width = 0
        if eligible and not self.costs.needs_plain(rows):
            offers = []
            for i, d in eligible:
                room = min(d.spec.max_draft, batch.max_tokens[i] - batch._num_tokens[i] - 1)
                uid = batch.uids[i]
                if d.spec.mode == "model":
                    n = room  # its proposals cost a draft forward each: the gate decides
                elif uid in self.known:
                    n, d.guess = len(d.propose(self.known[uid], room)), None
                else:
                    got = d.propose(None, room + 1)
                    d.guess = got[0] if got else None
                    n = max(len(got) - 1, 0)
                offers.append((d.acceptance, n))
            ceiling = max(d.spec.max_draft for _, d in eligible)
            width = choose_width(rows, offers, self.costs, ceiling)
        if width:
            responses = self._verify(batch, eligible, width, kinds)
            if responses is not None:
                self.plain_streak = 0
                return responses
        self.plain_streak += 1 if eligible else 0
        self.costs.start(rows, 0)
        for _, d in eligible:
            if d.spec.mode == "model":
                d.acceptance.forget(FORGET)  # nothing checks its drafts while it waits
        responses = plain()
        self.known = {}
        self._shadow(responses)
        self._emitted(responses)
        return responses

    def _eligible(self, batch: Any) -> list[tuple[int, RowDrafter]]:
        """(index, drafter) of the rows that may draft this step; drafters of rows gone go."""
        uids = batch.uids
        live = set(uids)
        if not live.issuperset(self.rows):
            self.rows = {u: d for u, d in self.rows.items() if u in live}
            self.plain &= live
        if not all(type(c) in TRIMMABLE for c in batch.prompt_cache):
            return []
        out = []
        for i, uid in enumerate(uids):
            d = self.rows.get(uid)
            if d is None:
                if uid in self.plain:
                    continue
                spec = self.lookup(uid)
                if spec is None or spec.mode not in MODES or spec.max_draft < 1:
                    self.plain.add(uid)
                    continue
                procs = batch.logits_processors[i] if batch.logits_processors else None
                if not draftable(procs):
                    self.plain.add(uid)  # a caller's processor sees one position at a time
                    continue
                d = self.rows[uid] = self._drafter(spec, batch, i)
            out.append((i, d))
        return out

    @staticmethod
    def _drafter(spec: Speculation, batch: Any, i: int) -> RowDrafter:
        d = RowDrafter(spec, NgramIndex(batch.tokens[i]))
        if spec.mode == "prediction" and spec.prediction:
            d.predicted = NgramIndex([-1, *spec.prediction])
            done = batch._num_tokens[i]
            d.output += batch.tokens[i][len(batch.tokens[i]) - done :] if done else []
        return d

    def _verify(self, batch: Any, eligible: list, width: int, kinds: list[tuple]) -> Any:
        """A verify step of `width`, or None when no row has a draft after its pending token."""
        batch.settle()
        uids = batch.uids
        if self.known and all(u in self.known for u in uids):
            pending = [self.known[u] for u in uids]  # the last verify step read them
        else:
            pending = batch._next_tokens.tolist()
        drafts: list[list[int]] = [[] for _ in pending]
        proposed = self._model_drafts(batch, eligible, pending, width)
        lazy: dict[int, mx.array] = {}
        for i, d in eligible:
            room = min(width, batch.max_tokens[i] - batch._num_tokens[i] - 1)
            if d.spec.mode == "model":
                if room > 0:
                    lazy[i] = proposed[uids[i]][:room]
                    drafts[i] = [0] * room  # its values stay on the device until verify reads
            else:
                drafts[i] = d.propose(pending[i], room)
        if not any(drafts):
            return None
        if batch.phases is not None:
            batch.phases.held.release()  # no queue point of ours in this step
        batch._hot = False
        self.costs.start(len(pending), max(len(d) for d in drafts))
        responses, accepted = verify(batch, pending, drafts, kinds, lazy)
        for i, d in eligible:
            if drafts[i]:
                d.acceptance.update(len(drafts[i]), accepted[i])
                d.drafted += len(drafts[i])
                d.accepted += accepted[i]
        nxt = batch._next_tokens.tolist() if batch.uids else []
        self.known = dict(zip(batch.uids, nxt, strict=True))
        self._emitted(responses)
        return responses

    def _model_drafts(
        self, batch: Any, eligible: list, pending: list[int], width: int
    ) -> dict[int, mx.array]:
        """The draft model's proposals for every draft-model row still in the batch."""
        model = self.draft_model()
        if self.model_drafts is None or self.model_drafts.model is not model:
            self.model_drafts = ModelDrafts(model) if model is not None else None
        uids = [batch.uids[i] for i, d in eligible if d.spec.mode == "model"]
        if self.model_drafts is None or not uids:
            return {}
        index = {u: i for i, u in enumerate(batch.uids)}
        histories = {u: batch.tokens[index[u]] for u in uids}
        return self.model_drafts.propose(histories, {u: pending[index[u]] for u in uids}, width)

    def _shadow(self, responses: list[Any]) -> None:
        """A plain step's token checks the guess of each row that did not draft (no cost)."""
        seen = set()
        for r in responses:
            d = self.rows.get(r.uid)
            if d is None or r.uid in seen or d.guess is None:
                continue
            seen.add(r.uid)
            d.acceptance.update(1, int(d.guess == r.token))
            d.guess = None

    def _emitted(self, responses: list[Any]) -> None:
        for r in responses:
            if (d := self.rows.get(r.uid)) is not None:
                d.emit(r.token)

    def gave_up(self) -> bool:
        """A draft model has not paid for GIVE_UP steps: the batch's lone row may take the
        serial step (no drafting there; it drafts again if it rejoins a batch). Not for lookup
        or a prediction: an edit's output leaves the copied text and comes back to it."""
        modes = {d.spec.mode for d in self.rows.values()}
        return self.plain_streak >= GIVE_UP and modes == {"model"}

    def stats(self, uid: int) -> tuple[int, int]:
        """(drafted, accepted) tokens of a row so far."""
        d = self.rows.get(uid)
        return (d.drafted, d.accepted) if d is not None else (0, 0)
