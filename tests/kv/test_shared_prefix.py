"""The batch cache with the rows' shared prefix held once (mlxd/kv/shared_prefix.py): the same
rows as mlx-lm's layout (every row extracts to the same arrays), after a step, a wave joining
against the same copy, a row without the prefix joining, rows leaving; and decode attention
over it equal to folded attention's over the whole rows (mlxd/model/shared_attention.py)."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from mlxd.kv.batch_roll import RollingBatchKVCache
from mlxd.kv.shared_prefix import SharedPrefixBatchKVCache, common_prefix
from mlxd.model.folded_attention import attention as folded_attention
from mlxd.model.shared_attention import shared_prefix_attention

H, D, P = 2, 8, 24


def _rows(own: list[int], seed: int = 0, prefix: mx.array | None = None):
    """Row caches whose first P positions hold one prefix (the same values), then `own[i]`
    tokens of their own."""
    mx.random.seed(seed)
    pk = mx.random.normal((1, H, P, D)) if prefix is None else prefix
    rows = []
    for n in own:
        c = KVCache()
        k = mx.concatenate([pk, mx.random.normal((1, H, n, D))], axis=2)
        c.update_and_fetch(k, k * 2)
        rows.append(c)
    return pk, rows


def _plain(rows) -> RollingBatchKVCache:
    return RollingBatchKVCache.merge(rows)


def _same_rows(a, b, n: int) -> None:
    for i in range(n):
        ra, rb = a.extract(i), b.extract(i)
        assert ra.offset == rb.offset
        assert mx.array_equal(ra.keys, rb.keys).item()
        assert mx.array_equal(ra.values, rb.values).item()


def _split(plain, like=None) -> SharedPrefixBatchKVCache:
    return SharedPrefixBatchKVCache.split_off(plain, tuple(range(P)), like)


def test_split_off_holds_the_prefix_once_and_extracts_every_row_as_it_was() -> None:
    _, rows = _rows([3, 9, 0, 5])
    plain = _plain(rows)
    shared = _split(_plain(rows))
    _same_rows(shared, plain, 4)
    assert shared.prefix_keys.shape == (1, H, P, D) and shared.keys.shape[2] == 9
    assert shared.offset.tolist() == plain.offset.tolist() == [P + 3, P + 9, P, P + 5]
    assert shared.nbytes < plain.keys.nbytes + plain.values.nbytes


@pytest.mark.parametrize("boolean", [True, False])
def test_a_decode_step_attends_as_folded_attention_over_the_whole_rows(boolean: bool) -> None:
    _, rows = _rows([3, 9, 0, 5])
    plain, shared = _plain(rows), _split(_plain(rows))
    mx.random.seed(7)
    new = mx.random.normal((4, H, 1, D))
    q = mx.random.normal((4, 2 * H, 1, D))
    full, own = plain.make_mask(1), shared.make_mask(1)  # as the model asks: before the update
    k, v = plain.update_and_fetch(new, new + 1)
    ks, vs = shared.update_and_fetch(new, new + 1)
    if not boolean:  # an additive mask, as some callers pass
        full, own = (mx.where(m, 0.0, -1e9) for m in (full, own))
    ref = folded_attention(q, k, v, D**-0.5, full)
    got = shared_prefix_attention(q, shared.prefix_keys, shared.prefix_values, ks, vs, D**-0.5, own)
    assert mx.allclose(got, ref, atol=1e-5, rtol=1e-5).item()
    _same_rows(shared, plain, 4)  # the step's key landed in every row's place


def test_a_wave_split_off_against_the_batch_shares_its_copy_and_extends() -> None:
    pk, first = _rows([3, 9])
    _, second = _rows([12, 1, 4], seed=1, prefix=pk)
    plain = _plain(first)
    plain.extend(_plain(second))
    batch = _split(_plain(first))
    wave = _split(_plain(second), like=batch)
    assert wave.prefix_keys is batch.prefix_keys
    batch.extend(wave)
    assert batch.prefix_keys is not None
    _same_rows(batch, plain, 5)


def test_a_row_without_the_prefix_turns_the_batch_plain() -> None:
    _, first = _rows([3, 9])
    _, other = _rows([2], seed=5)  # another prefix
    plain = _plain(first)
    plain.extend(_plain(other))
    batch = _split(_plain(first))
    batch.extend(_plain(other))
    assert batch.prefix_keys is None
    _same_rows(batch, plain, 3)


def test_rows_leaving_keep_the_prefix_and_the_rest_in_place() -> None:
    _, rows = _rows([3, 9, 0, 5])
    plain, shared = _plain(rows), _split(_plain(rows))
    plain.filter([0, 2, 3])
    shared.filter([0, 2, 3])
    _same_rows(shared, plain, 3)
    shared.filter([1])
    assert shared.extract(0).offset == P  # a row that is all prefix


def test_a_row_shorter_than_the_prefix_is_refused() -> None:
    _, rows = _rows([3, 9])
    with pytest.raises(ValueError, match="shorter than the shared prefix"):
        SharedPrefixBatchKVCache.split_off(_plain(rows), tuple(range(P + 4)))


def test_common_prefix() -> None:
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix([[1, 2], [1, 2]]) == 2 and common_prefix([[7], [8]]) == 0
