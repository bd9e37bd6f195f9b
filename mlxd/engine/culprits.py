"""Whose failure it is: a batched step that raised is put back as it was, each row's forward is
run alone to find the rows whose own input raises, and the caller's callables (a logits
processor, a sampler) are guarded so that their exception marks only the rows holding them.

Little here runs while the steps succeed. A failed decode step is undone from what the step
already kept (decode_step.py). A full-attention batch layer (bf16 or quantized) keeps only its
offset object: it advances by rebinding `offset` and counting `_idx`, and its in-place KV write
lands past the restored `_idx`, where the next step writes again. A sliding-window layer (a
ring, bf16 or quantized) or a recurrent one changes in place, so its attributes are kept
(`keep`: references, new ones for what it rewrites in place): the ring's write
lands in the slot the re-run writes first, and a recurrent layer replaces its state arrays.
A layer of any other kind makes a failed step end every row. A prefill call is heavy, so its
layers' attributes are saved before it (generator.py).
"""

import copy
import traceback
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    make_prompt_cache,
)
from mlx_lm.sample_utils import greedy_sampler

from ..constrain.processor import GrammarLogitsProcessor
from ..kv.batch_quantized import BatchQuantizedKVCache
from ..kv.batch_roll import RollingBatchKVCache
from ..kv.batch_rotating_quantized import BatchRotatingQuantizedKVCache
from .sampling import KeyedSampler, LogitBias, ParamSampler, Penalty

# Batch layers whose decode step `undo_step` takes back from their offset (see the module doc).
UNDOABLE = (BatchKVCache, RollingBatchKVCache, BatchQuantizedKVCache)
# Batch layers whose decode step changes them in place: their attributes are kept before it,
# with new objects for those the step rewrites in place (`left_padding -= 1` on a rotated
# ring, `cache[i] = state` on ArraysCache's list); the step rebinds the others.
KEPT: dict[type, tuple[str, ...]] = {
    BatchRotatingKVCache: ("left_padding",),
    BatchRotatingQuantizedKVCache: ("left_padding",),
    ArraysCache: ("cache", "left_padding", "lengths"),
}

Failed = list[tuple[int, BaseException]]  # (uid, the error that ends that row)
Fields = list[tuple[Any, dict[str, Any]]]  # caches (a CacheList's too) and their attributes
Kept = dict[int, Fields]  # layer index -> its caches' attributes before the step


def kept_layers(caches: list[Any]) -> list[int]:
    """The layers `keep` keeps before each decode step: none for full-attention models."""
    return [i for i, c in enumerate(caches) if type(c) not in UNDOABLE and _keepable(c)]


def _keepable(cache: Any) -> bool:
    if type(cache) is CacheList:
        return all(type(c) in UNDOABLE or _keepable(c) for c in cache.caches)
    return type(cache) in KEPT


def keep(caches: list[Any], layers: list[int]) -> Kept:
    """Layers `layers`' attributes before a decode step, for `undo_step`."""
    return {i: _leaves(caches[i]) for i in layers}


def _leaves(cache: Any) -> Fields:
    if type(cache) is CacheList:
        return [f for c in cache.caches for f in _leaves(c)]
    attrs = vars(cache).copy()
    for k in KEPT.get(type(cache), ()):  # a CacheList's full-attention part: none
        if (v := attrs[k]) is not None:
            attrs[k] = copy.copy(v)  # a new object sharing the data: no copy of it
    return [(cache, attrs)]


def undo_step(caches: list[Any], before: list[Any] | None, kept: Kept | None = None) -> bool:
    """Take back a one-token step that raised: each layer that advanced gets its offset object
    from before the step and one column less, each kept layer its attributes. False when a
    layer cannot be taken back."""
    kept = kept or {}
    if before is None or any(
        type(c) not in UNDOABLE and i not in kept for i, c in enumerate(caches)
    ):
        return False
    for i, (cache, was) in enumerate(zip(caches, before, strict=True)):
        if i in kept:
            _put_back(kept[i])
        elif cache.offset is not was:
            cache.offset, cache._idx = was, cache._idx - 1
    return True


def save(batch: Any) -> tuple[list[list[tuple[Any, dict]]], list[int]]:
    """A prompt batch's layers' attributes and each row's token count, before a prefill call."""
    return [_fields(c) for c in batch.prompt_cache], [len(t) for t in batch.tokens]


def restore(batch: Any, saved: tuple[list[list[tuple[Any, dict]]], list[int]]) -> None:
    layers, lengths = saved
    for fields in layers:
        _put_back(fields)
    for tokens, n in zip(batch.tokens, lengths, strict=True):
        del tokens[n:]


def _put_back(fields: Fields) -> None:
    for cache, attrs in fields:
        vars(cache).clear()
        vars(cache).update(attrs)


def _fields(cache: Any) -> list[tuple[Any, dict]]:
    attrs = {k: _kept(v) for k, v in vars(cache).items()}
    subs = cache.caches if isinstance(cache, CacheList) else ()
    return [(cache, attrs), *(f for sub in subs for f in _fields(sub))]


def _kept(value: Any) -> Any:
    """Small arrays as new references (`left_padding += pad` rewrites the array in place);
    the KV buffers as they are (a second reference would make MLX copy them on the next write)."""
    if isinstance(value, mx.array) and value.ndim <= 1:
        return copy.copy(value)
    if isinstance(value, list):
        return [_kept(v) for v in value]
    return value


def probe(model: Any, caches: list[Any], inputs: list[Any]) -> dict[int, BaseException]:
    """Row i's forward alone on a copy of its caches, fed `inputs[i]`: the rows that raise."""
    bad: dict[int, BaseException] = {}
    for i, x in enumerate(inputs):
        try:
            cache = [c.extract(i) for c in caches]
        except Exception:  # noqa: BLE001 - an empty batch layer holds nothing to take
            cache = make_prompt_cache(model)
        if (error := _raised(model, mx.array(x)[None], cache)) is not None:
            traceback.clear_frames(error.__traceback__)  # the row's error keeps no cache alive
            bad[i] = error
    return bad


def _raised(model: Any, x: mx.array, cache: list[Any]) -> BaseException | None:
    try:
        mx.eval(model(x, cache=cache))
    except Exception as e:  # noqa: BLE001 - this row's own input raises
        return e
    return None


class Guarded:
    """A caller's logits processor or sampler in a batch: when it raises, the rows that hold it
    (`owners()`, their uids) are marked failed and the step goes on with `fallback`'s output
    for them (the rows end after the step, without its token)."""

    def __init__(
        self, inner: Callable, failed: Failed, owners: Callable[[], list[int]], fallback: Callable
    ) -> None:
        self.inner, self.failed, self.owners, self.fallback = inner, failed, owners, fallback

    def __call__(self, *args: Any) -> Any:
        try:
            return self.inner(*args)
        except Exception as e:  # noqa: BLE001 - the rows holding it end, not the batch
            self.failed += [(uid, e) for uid in self.owners()]
            return self.fallback(*args)


def _unprocessed(_tokens: Any, logits: mx.array) -> mx.array:
    return logits


def _greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def guard_processors(row: Any, failed: Failed) -> list[Any]:
    """A batched row's logits processors; a caller's own raises for this row only. The
    batched step's own kinds stay as they are (it applies them to all rows at once)."""
    procs = row.processors if row.processors is not None else (row.req.logits_processors or [])
    ours = (LogitBias, Penalty, GrammarLogitsProcessor, Guarded)
    return [p if isinstance(p, ours) else Guarded(p, failed, lambda: [row.uid], _unprocessed)
            for p in procs]  # fmt: skip


def guard_sampler(sampler: Any, memo: dict[int, Guarded], failed: Failed, rows: dict) -> Any:
    """A caller's sampler raises for the rows holding it (`rows`: the batch's, by uid); rows
    that share one keep sharing one guard, which mlx-lm samples in one call."""
    if sampler in (None, greedy_sampler) or isinstance(sampler, (KeyedSampler, ParamSampler)):
        return sampler  # mlx-lm's greedy or one built from parameters
    if (guard := memo.get(id(sampler))) is None:
        owners = lambda: [u for u, r in rows.items() if r.req.sampler is sampler]  # noqa: E731
        guard = memo[id(sampler)] = Guarded(sampler, failed, owners, _greedy)
    return guard
