"""RollingBatchKVCache (mlxd/kv/batch_roll.py): its `finalize` rolls rows by slicing and must
leave exactly the arrays mlx-lm's BatchKVCache leaves (oracle: BatchKVCache and `dynamic_roll`
run in the same test), and the engine's batched prefill must take it."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, dynamic_roll

import mlxd.kv.take_rows as take_rows_module
from mlxd.kv import roll_kernel
from mlxd.kv.batch_roll import RollingBatchKVCache, RowKVCache, roll_rows, rolling

H, D = 2, 8


def _kv(n: int, key: int) -> tuple[mx.array, mx.array]:
    k = mx.random.normal((1, H, n, D), key=mx.random.key(key)).astype(mx.bfloat16)
    v = mx.random.normal((1, H, n, D), key=mx.random.key(key + 99)).astype(mx.bfloat16)
    return k, v


@pytest.mark.parametrize("shifts", [[0, 1, 5], [7, 0, 0], [11, 12, 30], [0, 0, 0]])
def test_roll_rows_equals_dynamic_roll(shifts: list[int]) -> None:
    x = mx.random.normal((3, H, 12, D), key=mx.random.key(3))
    want = dynamic_roll(x, mx.array(shifts)[:, None], axis=2)
    assert mx.array_equal(roll_rows(x, shifts), want).item()


def test_the_roll_kernel_only_on_cuda() -> None:
    """The kernel where MLX runs on CUDA; on this CPU the slices always."""
    x = mx.zeros((2, 1, 4, 8))
    assert roll_kernel.available(x) is (mx.cuda.is_available() and mx.default_device() == mx.gpu)


@pytest.mark.skipif(not mx.cuda.is_available(), reason="MLX-CUDA's kernel (cuda_tests.sh)")
@pytest.mark.parametrize("dtype,d", [(mx.bfloat16, 128), (mx.bfloat16, 6), (mx.float32, 64)])
def test_the_cuda_roll_kernel_leaves_the_slices_values(
    monkeypatch: pytest.MonkeyPatch, dtype: mx.Dtype, d: int
) -> None:
    """One launch (uint4 moves where a token's row is 16-byte whole, else elements) against
    the slices, bit for bit, shifts past the length and negative ones included."""
    x = mx.random.normal((5, 3, 37, d), key=mx.random.key(4)).astype(dtype)
    shifts = [0, 1, 36, 40, -3]
    assert roll_kernel.available(x)
    got = roll_rows(x, shifts)
    monkeypatch.setattr(roll_kernel, "available", lambda x: False)
    want = roll_rows(x, shifts)
    assert mx.array_equal(got, want).item()
    assert mx.array_equal(want, dynamic_roll(x, mx.array(shifts)[:, None], axis=2)).item()


def _row(n: int, key: int, cls: type) -> KVCache:
    c = cls()
    if n:
        c.update_and_fetch(*_kv(n, key))
    return c


@pytest.mark.parametrize("cached", [[5, 0, 9], [0, 0, 0], [3, 3, 3]])
def test_right_padded_prefill_and_finalize_leave_mlx_lm_s_arrays(cached: list[int]) -> None:
    new = [4, 7, 1]  # right padding 3, 0, 6
    batches = []
    for cls in (KVCache, RowKVCache):
        b = cls.merge([_row(n, 10 * i, cls) for i, n in enumerate(cached)])
        lengths, longest = new, max(new)
        b.prepare(lengths=lengths, right_padding=[longest - n for n in lengths])
        feed = [_kv(longest, 50 + i) for i in range(len(new))]
        b.update_and_fetch(*(mx.concatenate([f[j] for f in feed]) for j in range(2)))
        b.finalize()
        step = mx.random.normal((len(new), H, 1, D), key=mx.random.key(77)).astype(mx.bfloat16)
        b.update_and_fetch(step, step)  # a decode step after the roll
        batches.append(b)
    want, got = batches
    assert type(want) is BatchKVCache and type(got) is RollingBatchKVCache
    for name in ("keys", "values", "offset", "left_padding"):
        assert mx.array_equal(getattr(got, name), getattr(want, name)).item(), name
    assert got._idx == want._idx and got._right_padding is None


@pytest.mark.parametrize("way", ["gather", "slices"])  # kv/take_rows.py: slices on CUDA
@pytest.mark.parametrize(
    "cached,keep",
    [([5, 0, 9], [0, 1, 2]), ([4, 4, 6], [0, 1, 2]), ([5, 0, 9], [0, 2]), ([5, 0, 9], [1]),
     ([5, 0, 9], [1, 2]), ([5, 0, 9], [2, 0])],
)  # fmt: skip
def test_filter_leaves_mlx_lm_s_arrays(
    cached: list[int], keep: list[int], way: str, monkeypatch
) -> None:
    """Any selection, every row in order included (the common left padding trimmed), then a
    decode step: the arrays mlx-lm's BatchKVCache.filter leaves, with the kept rows taken by
    a gather or by slices."""
    monkeypatch.setattr(take_rows_module, "sliced", lambda: way == "slices")
    want, got = (cls.merge([_row(n, 10 * i, cls) for i, n in enumerate(cached)])
                 for cls in (KVCache, RowKVCache))  # fmt: skip
    for b in (want, got):
        b.filter(keep)
        step = mx.random.normal((len(keep), H, 1, D), key=mx.random.key(5)).astype(mx.bfloat16)
        b.update_and_fetch(step, step)
    for name in ("keys", "values", "offset", "left_padding"):
        assert mx.array_equal(getattr(got, name), getattr(want, name)).item(), name
    assert got._idx == want._idx


def test_keeping_every_row_copies_nothing() -> None:
    """mlx-lm gathers the whole cache (`keys[indices]`) even when every row stays, e.g. when
    a prefill wave moves to decoding; the rolling cache keeps its arrays."""
    b = RowKVCache.merge([_row(n, 10 * i, RowKVCache) for i, n in enumerate([5, 0, 9])])
    keys, values = b.keys, b.values
    b.filter([0, 1, 2])
    assert b.keys is keys and b.values is values
    b.filter([0, 2])
    assert b.keys is not keys  # a real selection still gathers


def test_rolling_converts_plain_kv_layers_only() -> None:
    plain = _row(4, 1, KVCache)
    row = rolling(plain)
    assert type(row) is RowKVCache and row.keys is plain.keys and row.offset == 4
    other = object()
    assert rolling(other) is other


def test_engine_batched_prefill_finalizes_through_rolling_caches(tiny_model, monkeypatch) -> None:
    """Rows of different lengths admitted together: the prompt batch is a RollingBatchKVCache
    (tests/engine/test_batching.py checks those rows' tokens against BatchGenerator)."""
    from mlx_lm import load

    from mlxd.engine.engine import Engine
    from mlxd.engine.request import GenerationRequest

    calls = []
    original = RollingBatchKVCache.finalize

    def spy(self: RollingBatchKVCache) -> None:
        calls.append(self._right_padding is not None)
        original(self)

    monkeypatch.setattr(RollingBatchKVCache, "finalize", spy)
    model, tok = load(str(tiny_model("qwen3")))
    engine = Engine(model)
    try:
        prompts = [tok.encode(t) for t in ("a b c d e f g", "hello", "one two three")]
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=3) for p in prompts]
        for handle in engine.submit_many(reqs):
            assert len([e for e in handle]) == 3
    finally:
        engine.close()
    assert calls and all(calls)
