"""A draft model proposing for every drafting row of a batch at once.

The draft keeps one BatchKVCache per layer, a row per drafting uid, holding exactly the tokens
the target's cache holds for that row (its prompt and emitted tokens). A verify step:
1. rows new to the draft prefill alone (their whole history) and join its batch cache;
2. one catch-up forward feeds every row what it lacks (the tokens accepted since its last
   proposal, then the pending token), right-padded to the longest; each row's first draft is
   the argmax at its own last position, and the padding rolls into the left padding;
3. width - 1 more one-token forwards draft greedily (drafts need not be samples: the target
   samples every position and keeps only matches, verify.py);
4. the width - 1 drafts it fed are trimmed off every row alike, so the cache again holds only
   what the target holds, and the next catch-up feeds the accepted ones.
Nothing here waits for the GPU: the drafts stay on the device, the verify step feeds them to
the target as they are and reads them with its own samples (one sync a step, as mlx-lm's).
"""

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

PREFILL_STEP = 512  # a new row's history goes through the draft in chunks this long


def draft_refusal(draft_model: Any, model: Any = None) -> str | None:
    """Why `draft_model` cannot draft for `model` in the batched step (None: it can): its
    caches must be plain (sliding windows and recurrent state cannot take a ragged roll-back
    here), and its token ids must be the model's (a larger vocabulary could draft ids the
    model's embedding does not have)."""
    if draft_model is None:
        return "no draft model is loaded (--draft-model)"
    kinds = sorted({type(c).__name__ for c in make_prompt_cache(draft_model)
                    if type(c) is not KVCache})  # fmt: skip
    if kinds:
        return f"the draft model has {', '.join(kinds)} layers; batched drafting needs plain KV"
    ours, theirs = _vocab(draft_model), _vocab(model) if model is not None else None
    if ours is not None and theirs is not None and ours > theirs:
        return f"the draft model's vocabulary ({ours}) is larger than the model's ({theirs})"
    return None


def _vocab(model: Any) -> int | None:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None) or getattr(
        getattr(args, "text_config", None), "vocab_size", None
    )
    return size if isinstance(size, int) else None


class ModelDrafts:
    """The draft model's batch cache over the drafting rows, and their proposals."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: list[BatchKVCache] | None = None
        self.uids: list[int] = []  # the cache's rows, in order
        self.fed: dict[int, int] = {}  # tokens of each row's history the cache holds

    def propose(
        self, histories: dict[int, list[int]], pending: dict[int, int], width: int
    ) -> dict[int, mx.array]:
        """`width` greedy drafts (a lazy uint32 row each) after each uid's history + pending
        token. `histories`: what the target's cache holds for each drafting uid (rows absent
        have left)."""
        self._keep(set(histories))
        for uid, history in histories.items():
            if uid not in self.fed:
                self._join(uid, history)
        assert self.cache is not None
        feeds = [histories[u][self.fed[u] :] + [pending[u]] for u in self.uids]
        longest = max(len(f) for f in feeds)
        x = mx.array([f + [f[-1]] * (longest - len(f)) for f in feeds], dtype=mx.uint32)
        logits = self.model(x, cache=self.cache)
        last = mx.array([len(f) - 1 for f in feeds])
        y = mx.argmax(logits[mx.arange(len(feeds)), last], axis=-1)
        pads = [longest - len(f) for f in feeds]
        if any(pads):
            for layer in self.cache:
                layer.prepare(right_padding=pads)
                layer.finalize()
        drafts = [y]
        for _ in range(width - 1):
            logits = self.model(y[:, None], cache=self.cache)
            y = mx.argmax(logits[:, -1], axis=-1)
            drafts.append(y)
        if width > 1:
            for layer in self.cache:
                layer.trim(width - 1)
        out = mx.stack(drafts, axis=1).astype(mx.uint32)
        for u in self.uids:
            self.fed[u] = len(histories[u]) + 1
        return {u: out[r] for r, u in enumerate(self.uids)}

    def _keep(self, live: set[int]) -> None:
        """Rows that left the batch leave the draft's cache."""
        keep = [i for i, u in enumerate(self.uids) if u in live]
        if len(keep) == len(self.uids):
            return
        self.uids = [self.uids[i] for i in keep]
        self.fed = {u: self.fed[u] for u in self.uids}
        if not keep:
            self.cache = None
            return
        idx = mx.array(keep)
        for layer in self.cache or []:
            layer.filter(idx)

    def _join(self, uid: int, history: list[int]) -> None:
        """A new row: its history through the draft alone, its caches merged into the batch."""
        own = make_prompt_cache(self.model)
        for at in range(0, len(history), PREFILL_STEP):
            self.model(mx.array([history[at : at + PREFILL_STEP]], dtype=mx.uint32), cache=own)
            mx.eval([c.state for c in own])
        merged = [BatchKVCache.merge([c]) for c in own]
        if self.cache is None:
            self.cache = merged
        else:
            for layer, new in zip(self.cache, merged, strict=True):
                layer.extend(new)
        self.uids.append(uid)
        self.fed[uid] = len(history)
