"""BatchQuantizedKVCache, model-free: after merge / update / filter / extend / extract, each
row's (packed, scales, biases) bytes equal its solo QuantizedKVCache's, and the bf16 batch
quantized in place equals each row's solo `to_quantized`. Oracles: mlx-lm's QuantizedKVCache,
KVCache.to_quantized and BatchKVCache, run in the same test."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from mlxd.kv.batch_quantized import BatchQuantizedKVCache

H, D = 2, 64


def _kv(n: int, key: int, dtype=mx.float16) -> tuple[mx.array, mx.array]:
    k = mx.random.normal((1, H, n, D), key=mx.random.key(key)).astype(dtype)
    v = mx.random.normal((1, H, n, D), key=mx.random.key(key + 1000)).astype(dtype)
    return k, v


def _solo(lengths: list[int], bits: int, group: int, chunk: int = 5) -> list[QuantizedKVCache]:
    """Solo caches filled in chunks, as a serial prefill would."""
    caches = []
    for r, n in enumerate(lengths):
        c = QuantizedKVCache(group_size=group, bits=bits)
        k, v = _kv(n, 10 * r)
        for s in range(0, n, chunk):
            c.update_and_fetch(k[:, :, s : s + chunk], v[:, :, s : s + chunk])
        caches.append(c)
    return caches


def _same(got: QuantizedKVCache, want: QuantizedKVCache) -> None:
    assert got.offset == want.offset
    assert (got.bits, got.group_size) == (want.bits, want.group_size)
    for a, b in zip((*got.keys, *got.values), (*want.keys, *want.values), strict=True):
        n = want.offset
        assert a[..., :n, :].shape == b[..., :n, :].shape
        assert mx.array_equal(a[..., :n, :], b[..., :n, :]).item()


@pytest.mark.parametrize("bits,group", [(8, 64), (4, 32), (4, 64)])
def test_merge_then_extract_gives_each_row_back(bits: int, group: int) -> None:
    solo = _solo([7, 19, 1, 12], bits, group)
    batch = BatchQuantizedKVCache.merge(solo)
    assert batch.left_padding.tolist() == [12, 0, 18, 7]
    assert batch.offset.tolist() == [7, 19, 1, 12]
    for i, want in enumerate(solo):
        _same(batch.extract(i), want)


def test_new_tokens_in_the_batch_equal_each_row_s_solo_update() -> None:
    solo = _solo([3, 9, 6], 4, 32)
    batch = BatchQuantizedKVCache.merge(solo)
    for step in range(300):  # past a 256-column buffer boundary
        k, v = _kv(1, 5000 + step)
        kb = mx.repeat(k, 3, axis=0) * mx.array([1.0, -2.0, 0.5])[:, None, None, None]
        vb = mx.repeat(v, 3, axis=0) + mx.array([0.0, 1.0, -1.0])[:, None, None, None]
        kb, vb = kb.astype(mx.float16), vb.astype(mx.float16)
        batch.update_and_fetch(kb, vb)
        for i, c in enumerate(solo):
            c.update_and_fetch(kb[i : i + 1], vb[i : i + 1])
    for i, want in enumerate(solo):
        _same(batch.extract(i), want)
    keys, _ = batch.keys_and_values()
    assert keys[0].shape[2] == batch.size() == 309


def test_filter_keeps_rows_and_drops_shared_padding() -> None:
    solo = _solo([4, 20, 11, 9], 8, 64)
    batch = BatchQuantizedKVCache.merge(solo)
    batch.filter([0, 2, 3])  # the longest row leaves: every row now has padding on the left
    assert batch.size() == 11 and batch.left_padding.tolist() == [7, 0, 2]
    for i, want in zip(range(3), [solo[0], solo[2], solo[3]], strict=True):
        _same(batch.extract(i), want)


def test_extend_right_aligns_both_batches() -> None:
    a_solo, b_solo = _solo([5, 8], 4, 64), _solo([13, 2, 6], 4, 64)
    a = BatchQuantizedKVCache.merge(a_solo)
    a.extend(BatchQuantizedKVCache.merge(b_solo))
    assert a.size() == 13 and a.left_padding.tolist() == [8, 5, 0, 11, 7]
    for i, want in enumerate(a_solo + b_solo):
        _same(a.extract(i), want)


def test_extend_with_an_empty_batch_adds_rows_of_padding_only() -> None:
    a = BatchQuantizedKVCache.merge(_solo([5, 8], 8, 64))
    a.extend(BatchQuantizedKVCache([0], group_size=64, bits=8))
    assert a.left_padding.tolist() == [3, 0, 8] and a.offset.tolist() == [5, 8, 0]


def test_rows_with_different_schemes_never_merge() -> None:
    with pytest.raises(ValueError, match="different KV schemes"):
        BatchQuantizedKVCache.merge(_solo([3], 8, 64) + _solo([3], 4, 64))


def test_a_bf16_batch_quantized_in_place_equals_each_row_s_to_quantized() -> None:
    solo = []
    for r, n in enumerate([6, 14, 3]):
        c = KVCache()
        c.update_and_fetch(*_kv(n, 77 + r))
        solo.append(c)
    bf16 = BatchKVCache.merge(solo)
    batch = BatchQuantizedKVCache.from_batch(bf16, group_size=32, bits=4)
    for i, c in enumerate(solo):
        _same(batch.extract(i), c.to_quantized(group_size=32, bits=4))


def test_right_padded_prefill_rolls_like_batch_kv_cache() -> None:
    """BatchGenerator's prompt batches: right padding, then finalize() rolls it to the left."""
    bf16, quant = BatchKVCache([0, 0]), BatchQuantizedKVCache([0, 0], group_size=64, bits=8)
    for c in (bf16, quant):
        c.prepare(right_padding=[3, 0])
    k = mx.concatenate([_kv(8, 1)[0], _kv(8, 2)[0]]).astype(mx.float16)
    v = mx.concatenate([_kv(8, 3)[1], _kv(8, 4)[1]]).astype(mx.float16)
    bf16.update_and_fetch(k, v)
    quant.update_and_fetch(k, v)
    bf16.finalize()
    quant.finalize()
    assert quant.left_padding.tolist() == bf16.left_padding.tolist() == [3, 0]
    assert quant.offset.tolist() == bf16.offset.tolist()
    want = BatchQuantizedKVCache.from_batch(bf16, group_size=64, bits=8)
    for i in range(2):
        _same(quant.extract(i), want.extract(i))
    assert mx.array_equal(quant.make_mask(1), bf16.make_mask(1)).item()


def test_trim_and_bytes() -> None:
    batch = BatchQuantizedKVCache.merge(_solo([10, 4], 8, 64))
    assert batch.nbytes == sum(x.nbytes for x in (*batch.keys, *batch.values))
    assert batch.trim(3) == 3 and batch.size() == 7 and batch.offset.tolist() == [7, 1]
