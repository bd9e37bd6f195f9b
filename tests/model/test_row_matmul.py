"""The `+gemm` modes of `--batched-attention` (mlxd/model/row_matmul.py): a batched decode step's
projections and output head through `mx.gather_mm` instead of a plain matmul.

The CPU's gather_mm takes float32 only, and in float32 it gives the matmul's bits, so here the
wiring is tested exactly on the float32 tiny models (every projection of every step went through
it, and the logits equal folded+fused's); the engine and server refuse the modes off CUDA by
name. On CUDA (bench/h200/cuda_tests.sh) the bf16 product is checked against float32."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.folded_models import PROMPTS, load_model, padded_decode, qwen2_model

from mlxd.engine.batch import BatchConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model import folded_attention as fa
from mlxd.model import row_matmul as rm

cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="the bf16 kernel needs MLX-CUDA")
no_cuda = pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the modes are served")
# Bit-equality is the CPU's float32 gather_mm; CUDA's kernel rounds otherwise (tested below).
cpu_bits = pytest.mark.skipif(mx.cuda.is_available(), reason="CUDA's gather_mm rounds otherwise")


@pytest.fixture
def gathers(monkeypatch) -> list[tuple[int, int]]:
    """(rows, width) of every RowsMatmul call, so a test sees which projections took it."""
    seen: list[tuple[int, int]] = []
    real = rm.RowsMatmul.__call__

    def spy(self, x):
        seen.append((x.shape[0], self.wt.shape[-1]))
        return real(self, x)

    monkeypatch.setattr(rm.RowsMatmul, "__call__", spy)
    return seen


@cpu_bits
@pytest.mark.parametrize("rows", [2, 8, 33])
def test_rows_matmul_equals_the_matmul_in_float32(rows: int) -> None:
    mx.random.seed(rows)
    w = mx.random.normal((160, 96))
    x = mx.random.normal((rows, 1, 96))
    got = rm.RowsMatmul(w)(x)
    assert got.shape == (rows, 1, 160)
    assert mx.array_equal(got, x @ w.T).item()


@cpu_bits
def test_rows_linear_takes_only_a_batched_step(gathers) -> None:
    mx.random.seed(1)
    lin = nn.Linear(64, 48, bias=True)
    mx.eval(lin.parameters())
    wrapped = rm.rows_linear(lin)
    assert wrapped is not None
    for shape in [(1, 1, 64), (3, 5, 64), (64,)]:  # one row, a prefill chunk, a vector
        x = mx.random.normal(shape)
        assert mx.array_equal(wrapped(x), lin(x)).item()
    assert gathers == []
    x = mx.random.normal((4, 1, 64))
    assert mx.array_equal(wrapped(x), lin(x)).item()  # the bias is added after the product
    assert gathers == [(4, 48)]
    assert rm.rows_linear(nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4)) is None


@cpu_bits
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "qwen2"])
def test_gemm_model_equals_folded_fused_bit_for_bit(arch, tiny_model, gathers) -> None:
    model = qwen2_model() if arch == "qwen2" else load_model(tiny_model, arch)
    model.set_dtype(mx.float32)  # the CPU's gather_mm takes float32 only
    expected = padded_decode(fa.folded(model, fuse=True), 8, [0, 4, 9])
    assert gathers == []
    got = padded_decode(fa.folded(model, fuse=True, gemm=True), 8, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    layers = model.model.layers
    dense = sum(hasattr(lay.mlp, "gate_proj") for lay in layers)  # 0 in the tiny MoE
    per_step = 2 * len(layers) + 2 * dense + 1  # q/k/v and o a layer, gate/up and down, head
    assert len(gathers) == 8 * per_step  # every decode step; the prefill took none
    assert all(rows == 3 for rows, _ in gathers)
    assert gathers[-1][1] == model.args.vocab_size  # the head: tied or lm_head
    assert type(model.model.embed_tokens) is nn.Embedding  # the caller's model is untouched
    assert "lm_head" not in model or type(model.lm_head) is nn.Linear
    assert all(type(lay.self_attn.o_proj) is nn.Linear for lay in layers)


def test_the_parts_knob_routes_only_the_named_projections(tiny_model, gathers, monkeypatch):
    model = load_model(tiny_model, "qwen3")
    monkeypatch.setenv("MLXD_GEMM_PARTS", "o,head")
    shadow = fa.folded(model, fuse=True, gemm=True)
    layer = shadow.model.layers[0]
    assert type(layer.self_attn.inner.o_proj) is rm.RowsLinear
    assert layer.self_attn.qkv.rows is None and layer.mlp._gate_up.rows is None
    assert type(layer.mlp.inner.down_proj) is nn.Linear
    assert type(shadow.model.embed_tokens) is rm.RowsEmbedding


def test_quantized_layers_keep_their_own_kernels(tiny_model, gathers) -> None:
    model = load_model(tiny_model, "qwen3")
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    expected = padded_decode(fa.folded(model, fuse=True), 3, [0, 4, 9])
    got = padded_decode(fa.folded(model, fuse=True, gemm=True), 3, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    assert gathers == []  # every projection and the tied head are quantized


def test_a_gemm_model_lists_each_weight_once(tiny_model) -> None:
    from mlx.utils import tree_flatten

    model = load_model(tiny_model, "qwen3")
    plain = len(tree_flatten(fa.folded(model, fuse=True).parameters()))
    assert len(tree_flatten(fa.folded(model, fuse=True, gemm=True).parameters())) == plain


@no_cuda
def test_gemm_modes_are_refused_by_name_where_there_is_no_cuda(tiny_model, tmp_path) -> None:
    from mlxd.cli import build_parser
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    model = load_model(tiny_model, "qwen3")
    for mode in ("folded+fused+gemm", "flash+fused+gemm"):
        with pytest.raises(ValueError, match="needs? MLX's CUDA backend"):
            Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=mode))
    argv = ["serve", "--model", str(tiny_model("qwen3")), "--data-dir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "--batched-attention", "folded+fused+gemm"])
    with pytest.raises(ModelLoadError, match="need MLX's CUDA backend"):
        make_state(args)


@cuda
@pytest.mark.parametrize("rows", [2, 8, 32])
@pytest.mark.parametrize(("N", "K"), [(3072, 1024), (1024, 3072), (151936, 1024), (6144, 4096)])
def test_bf16_rows_matmul_is_within_bfloat16_rounding_of_float32(rows, N, K) -> None:
    mx.random.seed(N + rows)
    w = (mx.random.normal((N, K)) * 0.02).astype(mx.bfloat16)
    x = mx.random.normal((rows, 1, K)).astype(mx.bfloat16)
    got = rm.RowsMatmul(w)(x).astype(mx.float32)
    want = x.astype(mx.float32) @ w.astype(mx.float32).T
    scale = mx.abs(want).max().item()
    assert mx.abs(got - want).max().item() <= 2 * 2**-8 * scale


@cuda
def test_an_engine_in_gemm_mode_decodes_batched_rows_close_to_mlx(tiny_model, gathers) -> None:
    model = load_model(tiny_model, "qwen3")
    model.set_dtype(mx.bfloat16)
    firsts = {}
    for mode in ("mlx", "folded+fused+gemm"):
        engine = Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=mode))
        try:
            reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=6) for p in PROMPTS]
            firsts[mode] = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
        finally:
            engine.close()
    assert gathers  # the batched steps went through gather_mm
    for a, b in zip(firsts["mlx"], firsts["folded+fused+gemm"], strict=True):
        assert len(a) == len(b) == 6
        assert a[0][0] == b[0][0]  # the prefill's token: the same path in both modes
        for (ta, la), (tb, lb) in zip(a[1:], b[1:], strict=True):
            assert mx.abs(la - lb).max().item() < 0.05
            if ta != tb:  # a near-tie took another token: the contexts differ from here
                break
