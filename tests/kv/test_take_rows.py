"""Rows leaving a batch by slices (mlxd/kv/take_rows.py, on by default on CUDA only): the same
arrays as MLX's gather (`x[indices]`, mlx-lm's filter), in the caches and through
batch_generate against mlx-lm's with rows ending at different steps."""

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import KVCache
from parity.helpers import assert_same_batch, run_batch
from parity.test_batch_parity import batch_prompts

import mlxd
import mlxd.kv.take_rows as take_rows_module
from mlxd.kv.batch_quantized import BatchQuantizedKVCache
from mlxd.kv.take_rows import runs, take_rows

H, D = 2, 8
PICKS = [[0, 1, 2, 3, 4, 5], [0, 1, 3, 4, 5], [2, 3, 4, 5], [0, 2, 4], [5], [4, 1, 1], []]


@pytest.fixture
def by_slices(monkeypatch) -> list[list[tuple[int, int]]]:
    """Slices on whatever backend runs the test; the runs each filter took."""
    seen: list[list[tuple[int, int]]] = []

    def spy(keep: list[int]) -> list[tuple[int, int]]:
        seen.append(runs(keep))
        return seen[-1]

    monkeypatch.setattr(take_rows_module, "sliced", lambda: True)
    monkeypatch.setattr(take_rows_module, "runs", spy)
    return seen


def test_runs_are_keep_s_consecutive_stretches() -> None:
    assert runs([0, 1, 2, 4, 5, 7]) == [(0, 3), (4, 6), (7, 8)]
    assert runs([3, 1, 2]) == [(3, 4), (1, 3)] and runs([]) == []


@pytest.mark.parametrize("start", [0, 3])  # the shared left padding trimmed in the same take
@pytest.mark.parametrize("keep", PICKS)
def test_slices_equal_the_gather(keep: list[int], start: int) -> None:
    x = mx.random.normal((6, H, 9, D), key=mx.random.key(1)).astype(mx.bfloat16)
    want = x[mx.array(keep, dtype=mx.int32)][..., start:, :]
    for by_slices in (True, False):
        got = take_rows(x, keep, by_slices=by_slices, start=start)
        assert got.shape == want.shape and mx.array_equal(got, want).item(), by_slices


def test_slices_only_on_cuda(monkeypatch) -> None:
    for device, cuda, want in ((mx.gpu, True, True), (mx.gpu, False, False), (mx.cpu, True, False)):
        monkeypatch.setattr(mx, "default_device", lambda d=device: d)  # Metal is a GPU, not CUDA
        monkeypatch.setattr(mx.cuda, "is_available", lambda c=cuda: c)
        assert take_rows_module.sliced() is want, (device, cuda)


def test_a_quantized_batch_filtered_by_slices_equals_its_gather(monkeypatch) -> None:
    def batch() -> BatchQuantizedKVCache:
        rows = []
        for i, n in enumerate([4, 20, 11, 9]):
            c = KVCache()
            k = mx.random.normal((1, H, n, 64), key=mx.random.key(3 * i)).astype(mx.bfloat16)
            c.update_and_fetch(k, k * 2)
            rows.append(c.to_quantized(group_size=32, bits=8))
        return BatchQuantizedKVCache.merge(rows)

    want, got = batch(), batch()
    want.filter([0, 2, 3])
    monkeypatch.setattr(take_rows_module, "sliced", lambda: True)
    got.filter([0, 2, 3])
    for w, g in zip(want.keys + want.values, got.keys + got.values, strict=True):
        assert mx.array_equal(w, g).item()
    assert got.left_padding.tolist() == want.left_padding.tolist() == [7, 0, 2]


def test_batch_generate_with_rows_leaving_by_slices_is_mlx_lm_s(loaded_pair, by_slices) -> None:
    """Rows of different max_tokens end at different steps, so the batch filters them out; the
    middle one first, so the rows left are two runs."""
    pair = loaded_pair("llama")
    prompts = batch_prompts(pair.ref_tok)
    kw = dict(max_tokens=[14, 10, 12], return_token_ids=True, return_logprobs=True)
    ref = run_batch(mlx_lm.batch_generate, pair.ref_model, pair.ref_tok, prompts, seed=None, **kw)
    got = run_batch(mlxd.batch_generate, pair.got_model, pair.got_tok, prompts, seed=None, **kw)
    assert ref.error is None and [len(t) for t in ref.response.token_ids] == [14, 10, 12]
    assert_same_batch(ref, got, "llama, rows leaving by slices")
    assert [(0, 1), (2, 3)] in by_slices, by_slices
