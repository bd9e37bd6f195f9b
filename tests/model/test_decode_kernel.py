"""`--batched-attention flash` (mlxd/model/decode_kernel.py): the batched decode step's attention
as two CUDA kernels. It exists only on MLX's CUDA backend: elsewhere the mode is refused by name
(tested on the CPU, in CI); its numerics are tested on CUDA (bench/h200/cuda_tests.sh runs this
file there; on a machine without CUDA those tests are skipped and cover nothing)."""

import mlx.core as mx
import pytest
from fixtures.folded_models import engine_runs, load_model

from mlxd.engine.batch import BatchConfig
from mlxd.engine.engine import Engine
from mlxd.model import decode_kernel as dk
from mlxd.model import folded_attention as fa

cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="the kernels need MLX-CUDA")
no_cuda = pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the mode is served")


def test_chunks_fill_the_gpu_and_never_go_below_the_minimum_chunk() -> None:
    assert dk.chunks(32, 8, 4096) == 5  # 256 (row, head) pairs: ~1056 blocks
    assert dk.chunks(1, 8, 4096) == 4096 // dk._MIN_CHUNK  # one row: as many as keys allow
    assert dk.chunks(8, 8, 100) == 2 and dk.chunks(64, 8, 4096) == 3
    assert dk.chunks(200, 8, 4096) == 1
    assert dk.chunks(32, 8, 4096, blocks=2112) == 9
    assert dk.warps_for(128, 2, 8) == 8 and dk.warps_for(128, 8, 8) == 4  # 48 KB of shared


@no_cuda
def test_flash_is_refused_by_name_where_there_is_no_cuda(tiny_model, tmp_path) -> None:
    from mlxd.cli import build_parser
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    model = load_model(tiny_model, "qwen3")
    for mode in ("flash", "flash+fused"):
        with pytest.raises(ValueError, match="flash needs MLX's CUDA backend"):
            Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=mode))
    with pytest.raises(ValueError, match="flash needs MLX's CUDA backend"):
        fa.folded(model, flash=True)
    argv = ["serve", "--model", str(tiny_model("qwen3")), "--data-dir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "--batched-attention", "flash"])
    with pytest.raises(ModelLoadError, match="flash needs MLX's CUDA backend"):
        make_state(args)


def _inputs(B: int, heads: int, kv: int, L: int, D: int, room: int = 40, seed: int = 0):
    """bfloat16 q and views of key/value buffers with free room (as the cache hands them),
    left padding varied per row, every row with at least one key."""
    mx.random.seed(seed)
    q = mx.random.normal((B, heads, 1, D)).astype(mx.bfloat16)
    kb, vb = (mx.random.normal((B, kv, L + room, D)).astype(mx.bfloat16) for _ in range(2))
    pad = mx.array([(i * 37) % L for i in range(B)])
    mask = (mx.arange(L)[None] >= pad[:, None]).reshape(B, 1, 1, L)
    return q, kb[..., :L, :], vb[..., :L, :], mask


def _reference(q, k, v, scale, mask) -> mx.array:
    """The formula in float32 (folded attention's, on float32 inputs), as o_proj's input."""
    f = [x.astype(mx.float32) for x in (q, k, v)]
    out = fa.attention(*f, scale, mask)
    return out.transpose(0, 2, 1, 3).reshape(q.shape[0], 1, -1)


@cuda
@pytest.mark.parametrize(
    "B,heads,kv,L,D",
    [(2, 16, 8, 1, 128), (3, 16, 8, 37, 128), (32, 16, 8, 4097, 128), (8, 32, 8, 1000, 128),
     (4, 8, 2, 300, 64), (5, 16, 4, 513, 256), (2, 28, 4, 129, 128)],
)  # fmt: skip
def test_flash_equals_the_float32_formula_to_bfloat16_rounding(B, heads, kv, L, D) -> None:
    q, k, v, mask = _inputs(B, heads, kv, L, D)
    scale = D**-0.5
    got = dk.flash_attention(q, k, v, scale, mask)
    ref = _reference(q, k, v, scale, mask)
    assert got.shape == (B, 1, heads * D) and got.dtype == mx.bfloat16
    err = mx.abs(got.astype(mx.float32) - ref).max().item()
    # One bfloat16 rounding of the output (half an ulp of |x| <= 2^-8 |x|), with slack for
    # float32 summation order: far tighter than folded attention's bfloat16 scores allow.
    bound = 2**-7 * mx.abs(ref).max().item()
    assert err <= bound
    folded_err = mx.abs(_reference(q, k, v, scale, mask) - _bf16_folded(q, k, v, scale, mask))
    assert err <= folded_err.max().item() + 1e-6  # at least as close as the mode it replaces


def _bf16_folded(q, k, v, scale, mask) -> mx.array:
    out = fa.attention(q, k, v, scale, mask)
    return out.transpose(0, 2, 1, 3).reshape(q.shape[0], 1, -1).astype(mx.float32)


@cuda
def test_masked_keys_do_not_count_whatever_they_hold() -> None:
    q, k, v, mask = _inputs(4, 16, 8, 200, 128)
    poisoned = mx.where(mask.reshape(4, 1, 200, 1), v, mx.array(1e4, v.dtype))
    scale = 128**-0.5
    clean = dk.flash_attention(q, k, v, scale, mask)
    assert mx.array_equal(dk.flash_attention(q, k, poisoned, scale, mask), clean).item()
    only_last = mx.arange(200)[None] == 199
    one = dk.flash_attention(
        q, k, v, scale, mx.broadcast_to(only_last, (4, 200)).reshape(4, 1, 1, 200)
    )
    want = v[:, :, 199, :].astype(mx.float32)  # a single key: its value, per KV head's group
    want = mx.repeat(want, 2, axis=1).reshape(4, 1, -1)
    assert mx.array_equal(one.astype(mx.float32), want).item()


@cuda
def test_an_engine_in_flash_mode_decodes_batched_rows_close_to_mlx(tiny_model, monkeypatch) -> None:
    model = load_model(tiny_model, "qwen3")
    calls: list[int] = []

    def spy(*a):
        calls.append(1)
        return dk.flash_attention(*a)

    monkeypatch.setattr(fa, "flash_attention", spy)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17]]
    firsts = engine_runs(model, ("mlx", "flash+fused"), prompts)
    assert calls  # the batched steps went through the kernels
    for a, b in zip(firsts["mlx"], firsts["flash+fused"], strict=True):
        assert len(a) == len(b) == 6
        # The first token comes from the prefill, the same in both modes; each later one from a
        # batched decode step: close, not equal (the mode's rounding). A near-tie may pick
        # another token, after which the rows' contexts differ: compare up to there.
        assert a[0][0] == b[0][0]
        for (ta, la), (tb, lb) in zip(a[1:], b[1:], strict=True):
            assert mx.abs(la - lb).max().item() < 0.05
            if ta != tb:
                break
