"""kv/additive_mask.py: a batched prefill's padding mask handed to MLX-CUDA's cuDNN attention
already additive. Oracle: mlx-lm's BatchGenerator over its own caches (a boolean mask) in the
same test. On the CPU MLX's fallback masks a boolean with finfo.min and adds an additive mask;
the joins here never mask a whole query row, so both give the same bits, and the CPU runs the
plumbing with the CUDA check forced. On MLX-CUDA (cuda_tests.sh) the check is the real one."""

import copy
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from fixtures.batch_oracle import assert_same_outputs
from mlx_lm.generate import BatchGenerator

from bench.probes.probe_join import restored
from mlxd.config import EngineConfig
from mlxd.engine.batch import BatchedRows
from mlxd.kv import additive_mask, batch_roll
from mlxd.kv.batch_quantized import mergeable
from mlxd.kv.batch_roll import RollingBatchKVCache

CUDA = mx.cuda.is_available()


def test_additive_is_mlx_cuda_s_conversion() -> None:
    mask = mx.array([[True, False, True], [False, False, True]])
    out = additive_mask.additive(mask, mx.bfloat16)
    assert out.dtype == mx.bfloat16
    assert out.tolist() == [[0.0, -math.inf, 0.0], [-math.inf, -math.inf, 0.0]]


@pytest.mark.skipif(CUDA, reason="the CPU's answer; CUDA's is checked by the joins below")
def test_no_fused_prefill_off_cuda() -> None:
    assert not additive_mask.fused_prefill(mx.bfloat16, 128, 128)


@pytest.mark.parametrize(
    "dtype,k_dim,v_dim,env,want",
    [(mx.bfloat16, 128, 128, None, True), (mx.float16, 64, 64, None, True),
     (mx.float32, 128, 128, None, False), (mx.bfloat16, 256, 256, None, False),
     (mx.bfloat16, 128, 100, None, False), (mx.bfloat16, 128, 128, "0", False),
     (mx.bfloat16, 128, 128, "1", True)],
)  # fmt: skip
def test_fused_prefill_mirrors_mlx_cuda_s_cudnn_rule(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, k_dim: int, v_dim: int, env: Any, want: bool
) -> None:
    """MLX-CUDA's `supports_sdpa_cudnn` for several queries under an array mask."""
    monkeypatch.setattr(additive_mask, "_on_cuda_gpu", lambda: True)
    if env is None:
        monkeypatch.delenv("MLX_CUDA_USE_CUDNN_SDPA", raising=False)
    else:
        monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", env)
    assert additive_mask.fused_prefill(dtype, k_dim, v_dim) is want


def _load(tiny_model: Callable[..., Path], arch: str) -> Any:
    from mlx_lm import load

    return load(str(tiny_model(arch)))[0]


@pytest.fixture
def masks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """(queries, dtype) of every mask a RollingBatchKVCache handed out; on the CPU, the CUDA check
    forced to MLX-CUDA's answer for these shapes."""
    if not CUDA:
        monkeypatch.setattr(batch_roll, "fused_prefill", lambda *a: True)
    seen: list[Any] = []
    make = RollingBatchKVCache.make_mask

    def spy(self: RollingBatchKVCache, N: int, **kw: Any) -> Any:
        mask = make(self, N, **kw)
        seen.append((N, mask.dtype if isinstance(mask, mx.array) else mask))
        return mask

    monkeypatch.setattr(RollingBatchKVCache, "make_mask", spy)
    return seen


def _join(model: Any, caches: list[list[Any]], feeds: list[list[int]]) -> list[list[tuple]]:
    """mlx-lm's BatchGenerator: rows with restored caches joining with new tokens, then decode
    steps; (token, logprobs) per row and step."""
    gen = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    uids = gen.insert_segments([[f] for f in feeds], max_tokens=[6] * len(feeds), caches=caches)
    out: dict[int, list[tuple]] = {u: [] for u in uids}
    while responses := gen.next_generated():
        for r in responses:
            out[r.uid].append((r.token, r.logprobs))
    gen.close()
    return [out[u] for u in uids]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3"])  # gemma3: sliding layers beside
def test_a_join_with_the_additive_mask_gives_mlx_lms_bits(
    tiny_model: Callable[..., Path], masks: list[Any], arch: str
) -> None:
    """Rows with 9-40 cached tokens join with 3-17 new ones (right padding, then the roll):
    every prefill mask handed out additive, every token and logprob mlx-lm's."""
    model = _load(tiny_model, arch)
    model.set_dtype(mx.bfloat16)  # the dtype cuDNN's attention takes
    rng = random.Random(7)
    cached, new = [40, 9, 23, 31], [17, 3, 11, 8]
    feeds = [[rng.randrange(10, 500) for _ in range(n)] for n in new]
    rows = [restored(model, n, rng) for n in cached]
    if CUDA:  # the real check, for the model's KV shape
        k = rows[0][0].keys
        assert additive_mask.fused_prefill(k.dtype, k.shape[-1], rows[0][0].values.shape[-1])
    ref = _join(model, [[_copy(c) for c in row] for row in rows], feeds)
    got = _join(model, [mergeable(row, True) for row in rows], feeds)
    assert_same_outputs(got, ref)
    prefill = [dtype for n, dtype in masks if n > 1]
    assert prefill and all(d == mx.bfloat16 for d in prefill)  # every one additive


def _copy(c: Any) -> Any:
    """The layer as mlx-lm made it (its own class, the same arrays)."""
    return copy.copy(c)


def test_the_batch_hands_the_flag_to_the_rows_it_merges(tiny_model: Callable[..., Path]) -> None:
    """BatchedRows: on for a model type that takes it, off for other types."""
    qwen3, phi3 = _load(tiny_model, "qwen3"), _load(tiny_model, "phi3")
    assert BatchedRows(qwen3, EngineConfig()).additive_mask
    assert not BatchedRows(phi3, EngineConfig()).additive_mask
    merged = RollingBatchKVCache.merge([mergeable(restored(qwen3, 5, random.Random(1)), True)[0]])
    assert merged.additive_mask
    plain = RollingBatchKVCache.merge([mergeable(restored(qwen3, 5, random.Random(1)))[0]])
    assert not plain.additive_mask
