"""BatchRotatingQuantizedKVCache: quantized sliding-window rows in one batch.

Nobody ships this (mlx-lm's BatchRotatingKVCache raises "Quantization NYI", mlx-optiq leaves
sliding layers unquantized), so the oracle is mlx-lm's bf16 BatchRotatingKVCache driven through
the same merge / update / filter / extend / prepare / finalize, then `mx.quantize`: every one of
those operations only moves whole positions along the token axis and groups run along the head
dimension, so the quantized batch must hold the quantized bf16 batch slot for slot (bookkeeping
equal, each row's extracted tokens equal, every slot a row can attend equal). Rows are also
checked against their solo RotatingQuantizedKVCache (itself checked against optiq and mlx-lm in
test_rotating_quantized.py): `extract(i)` gives back the solo ring's tokens, byte for byte.

Under tiny gemma3 a batch merged from solo quantized caches decodes exactly as the reference
(mlx-lm's bf16 batch caches, quantized on read) for every row, padded or not. Against each row
decoding alone: same greedy tokens; logits bit-exact for a row whose ring sits at the batch's
phase (a full window merged straight after prefill); other rows attend the same quantized
tokens in another slot order, so the sums differ by reduction order. Measured on CPU: max
|dlogit| <= 2.5e-5 (logits of std ~4, as mlx-lm's own bf16 batch vs solo: 2.8e-5), except when
that noise flips one quantization code of a later layer's keys / values: 5.1e-3 once (8-bit,
group 32, a padded row) in 8 row-configurations x 20 steps. The bound asserted is 1e-2.
"""

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import BatchRotatingKVCache, RotatingKVCache, make_prompt_cache

from mlxd.kv.batch_quantized import mergeable
from mlxd.kv.batch_rotating_quantized import BatchRotatingQuantizedKVCache
from mlxd.kv.rotating_quantized import RotatingQuantizedKVCache, to_quantized_rotating

H, D, W, BITS, GROUP = 2, 64, 16, 4, 32
# a row's history: (chunks, kept in bf16 and converted at the end)
ROWS = [
    ([5], False),  # short: not wrapped
    ([5] + [1] * 20, False),  # wrapped by decoding: a rotated ring
    ([20], False),  # prefill past the window: 20 slots until its next step
    ([3, 4] + [1] * 14 + [7], False),  # a prefill after the ring rotated
    ([6] + [1] * 15, True),  # converted with a rotated ring
    ([9], True),  # converted before wrapping
]


def _kv(b: int, n: int, key: int) -> tuple[mx.array, mx.array]:
    k = mx.random.normal((b, H, n, D), key=mx.random.key(key)).astype(mx.bfloat16)
    v = mx.random.normal((b, H, n, D), key=mx.random.key(key + 7919)).astype(mx.bfloat16)
    return k, v


def _q(x: mx.array) -> tuple[mx.array, ...]:
    return tuple(mx.quantize(x, group_size=GROUP, bits=BITS))


def _same(got: Any, want: Any) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert mx.array_equal(a, b).item()


def _rows(spec: list) -> tuple[list, list]:
    """(quantized, bf16) solo rings with the same history."""
    quant, bf16 = [], []
    for r, (chunks, convert) in enumerate(spec):
        b, q = RotatingKVCache(W), RotatingQuantizedKVCache(W, group_size=GROUP, bits=BITS)
        q = RotatingKVCache(W) if convert else q
        for i, n in enumerate(chunks):
            k, v = _kv(1, n, 100 * r + i)
            q.update_and_fetch(k, v)
            b.update_and_fetch(k, v)
        quant.append(to_quantized_rotating(q, GROUP, BITS))
        bf16.append(b)
    return quant, bf16


def _check(batch: BatchRotatingQuantizedKVCache, ref: BatchRotatingKVCache, solo: list) -> None:
    """Bookkeeping equal to mlx-lm's; each row extracts to the quantized bf16 row and to its
    solo ring's latest tokens in temporal order."""
    for name in ("offset", "left_padding"):
        assert getattr(batch, name).tolist() == getattr(ref, name).tolist()
    assert (batch._idx, batch._offset, batch.rotated) == (ref._idx, ref._offset, ref.rotated)
    for i, s in enumerate(solo):
        got, want = batch.extract(i), ref.extract(i)
        assert isinstance(got, RotatingQuantizedKVCache)
        assert (got.offset, got._idx) == (want.offset, want._idx) == (s.offset, got._idx)
        _same(got.keys, _q(want.keys))
        _same(got.values, _q(want.values))
        n = got.keys[0].shape[2]  # a window, or more right after a prefill chunk
        assert n >= s.size()
        _same(got.keys, [x[..., -n:, :] for x in s._temporal_order(s.keys)])
        _same(got.values, [x[..., -n:, :] for x in s._temporal_order(s.values)])


def _step(batch: Any, ref: Any, solo: list, bf16: list, n: int, key: int) -> None:
    """Every row takes its own `n` tokens; what a row can attend is compared slot for slot."""
    k, v = _kv(ref.offset.shape[0], n, key)
    mask = ref.make_mask(n)[:, :, -1, :, None]  # [B, 1, S, 1]: the slots the last token sees
    got, want = batch.update_and_fetch(k, v), ref.update_and_fetch(k, v)
    for g, w in zip(got, want, strict=True):
        _same([mx.where(mask, x, 0) for x in g], [mx.where(mask, x, 0) for x in _q(w)])
    for i, (s, b) in enumerate(zip(solo, bf16, strict=True)):
        s.update_and_fetch(k[i : i + 1], v[i : i + 1])
        b.update_and_fetch(k[i : i + 1], v[i : i + 1])


def test_merge_decode_and_extract_give_each_row_s_bytes() -> None:
    solo, bf16 = _rows(ROWS)
    batch = RotatingQuantizedKVCache.merge(solo)
    ref = BatchRotatingKVCache.merge(bf16)
    assert isinstance(batch, BatchRotatingQuantizedKVCache)
    _check(batch, ref, solo)
    for t in range(25):  # the batch ring rotates; every row wraps
        _step(batch, ref, solo, bf16, 1, 1000 + t)
        _check(batch, ref, solo)
    _step(batch, ref, solo, bf16, 5, 2000)  # a prefill chunk over a rotated batch
    _check(batch, ref, solo)
    assert batch.nbytes == sum(x.nbytes for x in (*batch.keys, *batch.values))


def test_filter_then_go_on() -> None:
    solo, bf16 = _rows(ROWS)
    batch, ref = BatchRotatingQuantizedKVCache.merge(solo), BatchRotatingKVCache.merge(bf16)
    for t in range(3):
        _step(batch, ref, solo, bf16, 1, 3000 + t)
    keep = [0, 2, 5]
    batch.filter(keep)
    ref.filter(keep)
    solo, bf16 = [solo[i] for i in keep], [bf16[i] for i in keep]
    _check(batch, ref, solo)
    for t in range(20):
        _step(batch, ref, solo, bf16, 1, 4000 + t)
    _check(batch, ref, solo)


@pytest.mark.parametrize("steps_a,steps_b", [(0, 0), (3, 0), (2, 7), (17, 4)])
def test_extend_joins_batches_at_any_phase(steps_a: int, steps_b: int) -> None:
    solo, bf16 = _rows(ROWS)
    parts = []
    for rows, steps, key in ((slice(0, 2), steps_a, 5000), (slice(2, 6), steps_b, 6000)):
        s, b = solo[rows], bf16[rows]
        q, r = BatchRotatingQuantizedKVCache.merge(s), BatchRotatingKVCache.merge(b)
        for t in range(steps):
            _step(q, r, s, b, 1, key + t)
        parts.append((q, r, s, b))
    (qa, ra, sa, ba), (qb, rb, sb, bb) = parts
    qa.extend(qb)
    ra.extend(rb)
    _check(qa, ra, sa + sb)
    for t in range(20):
        _step(qa, ra, sa + sb, ba + bb, 1, 7000 + t)
    _check(qa, ra, sa + sb)


def test_right_padded_prefill_then_finalize() -> None:
    """BatchGenerator's prompt batch: rows right-padded to one length, prefilled in chunks
    (the padding must not evict a row's tokens), rolled to the right by finalize."""
    lengths, pad = [10, 25, 4], [15, 0, 21]
    batch = BatchRotatingQuantizedKVCache(W, [0, 0, 0], group_size=GROUP, bits=BITS)
    ref = BatchRotatingKVCache(W, [0, 0, 0])
    for c in (batch, ref):
        c.prepare(lengths=lengths, right_padding=pad)
    for i, n in enumerate((12, 13)):
        k, v = _kv(3, n, 8000 + i)
        mask = ref.make_mask(n)[:, :, -1, :, None]
        got, want = batch.update_and_fetch(k, v), ref.update_and_fetch(k, v)
        _same([mx.where(mask, x, 0) for x in got[0]], [mx.where(mask, x, 0) for x in _q(want[0])])
    batch.finalize()
    ref.finalize()
    solo = [ref.extract(i) for i in range(3)]  # the bf16 rows, quantized: the solo rings
    quant = [to_quantized_rotating(s, GROUP, BITS) for s in solo]
    _check(batch, ref, quant)
    for t in range(20):
        _step(batch, ref, quant, solo, 1, 9000 + t)
    _check(batch, ref, quant)


def test_from_batch_quantizes_a_bf16_batch_where_it_stands() -> None:
    _, bf16 = _rows(ROWS)
    ref = BatchRotatingKVCache.merge(bf16)
    for t in range(4):  # rotated, rows at different phases
        ref.update_and_fetch(*_kv(len(bf16), 1, 10_000 + t))
    batch = BatchRotatingQuantizedKVCache.from_batch(ref, GROUP, BITS)
    extracted = lambda: [to_quantized_rotating(ref.extract(i), GROUP, BITS) for i in range(6)]  # noqa: E731
    _check(batch, ref, extracted())
    for t in range(10):
        _step(batch, ref, [], [], 1, 11_000 + t)
    _check(batch, ref, extracted())


# under a model
TEXTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs far away from the farm.",
    "x y",
    "Tell me a story about a robot",
    "One two three four five six seven eight nine ten eleven twelve thirteen",
]


class _QuantizedOnRead:
    """The reference for a batch layer: mlx-lm's bf16 batch cache does all the bookkeeping
    (offset, masks, filter), reads are quantized."""

    def __init__(self, inner: Any, group: int, bits: int) -> None:
        self.inner, self.group_size, self.bits = inner, group, bits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple:
        k, v = self.inner.update_and_fetch(k, v)
        g, b = self.group_size, self.bits
        return tuple(mx.quantize(k, g, b)), tuple(mx.quantize(v, g, b))


def _prefill(model: Any, prompt: list[int], extra: int) -> tuple[list, mx.array]:
    """prompt[:-1] prefilled, `extra` greedy tokens decoded (bf16)."""
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    tok = mx.array([[prompt[-1]]])
    for _ in range(extra):
        tok = mx.argmax(model(tok, cache=cache)[:, -1, :], axis=-1, keepdims=True)
    return cache, tok


def _quantize(cache: list, group: int, bits: int) -> list:
    """maybe_quantize_kv_cache's step, with the rotating layers converted too."""
    out = [
        to_quantized_rotating(c, group, bits) if isinstance(c, RotatingKVCache)
        else c.to_quantized(group, bits)
        for c in cache
    ]  # fmt: skip
    return mergeable(out)


def _greedy(model: Any, tok: mx.array, cache: list, steps: int) -> tuple[list, list]:
    ids, logits = [], []
    for _ in range(steps):
        logits.append(model(tok, cache=cache)[:, -1, :])
        tok = mx.argmax(logits[-1], axis=-1, keepdims=True)
        ids.append(tok[:, 0].tolist())
    return ids, logits


@pytest.mark.parametrize("extra", [0, 5])  # merged straight after prefill / with rotated rings
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
def test_gemma3_batch_decodes_as_the_reference_and_as_each_row(
    tiny_model: Any, extra: int, bits: int, group: int
) -> None:
    model, tok = load(str(tiny_model("gemma3")))
    prompts = [tok.encode(t) for t in TEXTS]
    steps = 20  # the batch ring wraps at least once more
    solo = []
    for p in prompts:
        cache, last = _prefill(model, p, extra)
        solo.append(_greedy(model, last, _quantize(cache, group, bits), steps))

    rows = [_prefill(model, p, extra) for p in prompts]
    last = mx.concatenate([t for _, t in rows])
    bf16 = _merge_caches([c for c, _ in rows])
    ref = [_QuantizedOnRead(c, group, bits) for c in bf16]
    rows = [_prefill(model, p, extra) for p in prompts]
    batch = _merge_caches([_quantize(c, group, bits) for c, _ in rows])
    kinds = {type(c).__name__ for c in batch}
    assert kinds == {"BatchRotatingQuantizedKVCache", "BatchQuantizedKVCache"}
    lp = batch[0].left_padding.tolist()
    assert lp.count(0) >= 1 and max(lp) > 0

    ids, logits = _greedy(model, last, batch, steps)
    ref_ids, ref_logits = _greedy(model, last, ref, steps)
    assert ids == ref_ids
    for a, b in zip(logits, ref_logits, strict=True):
        assert mx.array_equal(a, b).item()  # every row, padded or not

    # each row alone: same tokens; bit-exact where the ring phases agree, else the envelope
    exact = {0} if extra == 0 else set()  # row 0: a full window, merged straight after prefill
    for r, (solo_ids, solo_logits) in enumerate(solo):
        assert [s[r] for s in ids] == [s[0] for s in solo_ids]
        for step in range(steps):
            if r in exact:
                assert mx.array_equal(logits[step][r], solo_logits[step][0]).item()
            else:
                diff = mx.abs(logits[step][r] - solo_logits[step][0]).max().item()
                assert diff < 1e-2  # the measured envelope (module docstring)

    # row 1 leaves; the rest go on as the reference does
    for c in (*batch, *ref):
        c.filter([0, 2, 3])
    nxt = mx.array([[ids[-1][r]] for r in (0, 2, 3)])
    ids2, logits2 = _greedy(model, nxt, batch, 6)
    ref_ids2, ref_logits2 = _greedy(model, nxt, ref, 6)
    assert ids2 == ref_ids2
    for a, b in zip(logits2, ref_logits2, strict=True):
        assert mx.array_equal(a, b).item()
