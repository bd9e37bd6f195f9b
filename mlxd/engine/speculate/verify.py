"""The verify step: each row's pending token and its drafts in one forward over [B, K + 1].

Row i feeds [y_i, d_i0 .. d_ik-1] (padded to K + 1 with y_i). The target samples its own token
at every position with the row's sampler (sample-and-match, as mlx-lm's speculative loop): the
drafts matching those samples are accepted, so every emitted token is the target's own sample
and the output keeps its distribution (greedy: its tokens). A row emits y_i and its accepted
drafts; the sample after them is its new pending token. The batch caches keep 1 + a_i positions
a row: all are trimmed to the longest kept run, then shorter rows roll their rejected tail into
their left padding (BatchKVCache's prepare(right_padding) + finalize, as after a ragged
prefill). Position 0 is processed as in the plain step (decode_step.process), the later ones
with the history each position would have had (processed.py). A draft model's drafts come as
device arrays (`lazy`): fed as they are, read with the samples (one sync).
"""

from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchRotatingKVCache

from ...kv.batch_roll import roll_rows
from ..output import Readout
from . import processed

Response = GenerationBatch.Response


def verify(
    batch: Any,
    pending: list[int],
    drafts: list[list[int]],
    kinds: list[tuple],
    lazy: dict[int, mx.array] | None = None,
) -> tuple[list[Any], list[int]]:
    """One verify step on a BiasedGenerationBatch: its responses (one per emitted token, in
    row order) and each row's accepted draft count. `lazy`: rows whose drafts are device
    arrays (their lists in `drafts` hold placeholders of the same length, filled here)."""
    width = max(len(d) for d in drafts)
    feed = [[y, *d, *[y] * (width - len(d))] for y, d in zip(pending, drafts, strict=True)]
    x = mx.array(feed, dtype=mx.uint32)
    if lazy:
        x = _fed_lazy(x, pending, lazy)
        if any(kinds[i] and (kinds[i][1] or kinds[i][2]) for i in lazy):
            _fill(drafts, lazy)  # penalties and grammars read the drafts position by position
            lazy = None
    with batch.adapter_rows(batch.uids):  # each row's adapter slot (engine/adapters.py)
        logits = batch.model(x, cache=batch.prompt_cache)  # (B, K + 1, vocab)
    first = batch.process(x[:, 0], logits[:, 0, :], kinds)
    consumed = [0] * len(drafts)
    if width:
        rest, consumed = processed.later(batch, kinds, drafts, logits[:, 1:, :])
        logits = mx.concatenate([first[:, None], rest], axis=1)
    else:
        logits = first[:, None]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampled = _sample(batch, logprobs, drafts)
    if lazy:
        _fill(drafts, lazy)  # computed before the forward that made the samples: no wait
    accepted = []
    for d, t in zip(drafts, sampled, strict=True):
        a = 0
        while a < len(d) and t[a] == d[a]:
            a += 1
        accepted.append(a)
    processed.settle(batch, kinds, drafts, consumed, accepted)
    _roll_back(batch.prompt_cache, width, accepted)
    responses = _respond(batch, pending, drafts, accepted, sampled, logprobs)
    return responses, accepted


def _fed_lazy(x: mx.array, pending: list[int], lazy: dict[int, mx.array]) -> mx.array:
    """`x` with each lazy row's drafts after its pending token (then its own padding)."""
    width = x.shape[1]
    rows = []
    for i, y in enumerate(pending):
        if i in lazy:
            d = lazy[i]
            pad = mx.full((width - 1 - d.shape[0],), y, dtype=mx.uint32)
            rows.append(mx.concatenate([mx.array([y], dtype=mx.uint32), d, pad]))
        else:
            rows.append(x[i])
    return mx.stack(rows)


def _fill(drafts: list[list[int]], lazy: dict[int, mx.array]) -> None:
    for i, d in lazy.items():
        drafts[i] = d.tolist()


def _sample(batch: Any, logprobs: mx.array, drafts: list[list[int]]) -> list[list[int]]:
    """Every row's sample at each of its positions (its drafts + 1), on the host."""
    b, width = logprobs.shape[0], logprobs.shape[1]
    samplers = [batch.fallback_sampler if s is None else s for s in (batch.samplers or [None] * b)]
    if all(s is samplers[0] for s in samplers):
        flat = samplers[0](logprobs.reshape(b * width, -1))
        return flat.reshape(b, width).tolist()
    rows = [s(logprobs[i, : len(drafts[i]) + 1]) for i, s in enumerate(samplers)]
    mx.eval(rows)
    return [r.tolist() for r in rows]


def _roll_back(caches: list[Any], width: int, accepted: list[int]) -> None:
    """Keep 1 + a_i of the K + 1 positions each row just wrote."""
    most = max(accepted)
    pads = [most - a for a in accepted]
    for cache in caches:
        if type(cache) is BatchRotatingKVCache:
            _cut_ring(cache, width - most, pads)
            continue
        if width > most:
            cache.trim(width - most)
        if most and any(pads):
            cache.prepare(right_padding=pads)
            cache.finalize()


def _cut_ring(ring: BatchRotatingKVCache, n: int, pads: list[int]) -> None:
    """A sliding window after a multi-token update is in temporal order, not rotated (mlx-lm's
    `_update_concat`): its rejected tail is cut like a plain layer's, the arrays end at the
    last kept slot (the next one-token update trims the front to the window from there), and
    shorter rows roll their rejected slots to the front, outside every later window."""
    if n:
        ring._idx -= n
        ring._offset -= n
        ring.offset = ring.offset - n
    ring.keys = ring.keys[..., : ring._idx, :]
    ring.values = ring.values[..., : ring._idx, :]
    if any(pads):
        ring.keys = roll_rows(ring.keys, pads)
        ring.values = roll_rows(ring.values, pads)
        shift = mx.array(pads)
        ring.offset = ring.offset - shift
        ring.left_padding = ring.left_padding + shift


def _respond(batch, pending, drafts, accepted, sampled, logprobs) -> list[Any]:
    """GenerationBatch.next's bookkeeping for every emitted token (max_tokens, stop sequences,
    the history in the cache), the new pending tokens, and the rows that finished leave."""
    responses, keep, nxt, nxt_lp, reads = [], [], [], [], {}
    for i, uid in enumerate(list(batch.uids)):
        a = accepted[i]
        tokens = [pending[i], *drafts[i][:a]]
        lps = [batch._next_logprobs[i], *(logprobs[i, j] for j in range(a))]
        finish, emitted = None, 0
        for tok in tokens:
            emitted += 1
            batch._num_tokens[i] += 1
            if batch._num_tokens[i] >= batch.max_tokens[i]:
                finish = "length"
            if batch._matchers[i].advance(tok):
                finish = "stop"
            if finish is not None:
                break
        batch.tokens[i].extend(tokens[:emitted])
        for j in range(emitted):
            last = finish is not None and j == emitted - 1
            cache = _extracted(batch, i, len(tokens) - emitted) if last else None
            all_tokens = batch.tokens[i] if last else None
            responses.append(Response(uid, tokens[j], lps[j], finish if last else None,
                                      cache, all_tokens))  # fmt: skip
        if finish is None:
            keep.append(i)
        nxt.append(sampled[i][a])
        nxt_lp.append(logprobs[i, a])
        if (want := batch.wants(uid)) is not None:
            y = mx.array([sampled[i][a]], dtype=mx.uint32)
            reads[uid] = Readout.of(want[0], want[1], y, logprobs[i, a])
    # the slices cross to other threads (MLX streams are per thread): evaluated here
    mx.eval(
        [r.logprobs for r in responses], nxt_lp, [a for r in reads.values() for a in r.arrays()]
    )
    batch.current_read, batch._next_read = batch._next_read, reads
    batch._next_tokens = mx.array(nxt, dtype=mx.uint32)
    batch._next_logprobs = nxt_lp
    if len(keep) < len(batch.uids):
        batch.filter(keep)
    return responses


def _extracted(batch: Any, i: int, extra: int) -> list[Any]:
    """A finishing row's caches, without the accepted tokens past its last emitted one."""
    cache = batch.extract_cache(i)
    if extra:
        for layer in cache:
            layer.trim(extra)
    return cache
