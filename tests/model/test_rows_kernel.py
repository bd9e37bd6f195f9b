"""The `+rows` mode of `--batched-attention` (mlxd/model/rows_kernel.py, row_matmul.py): a
batched decode step's projections and output head through a few-row CUDA kernel.

The kernel exists only on MLX-CUDA, so on the CPU the wiring is tested with the kernel's call
swapped for the plain matmul (`routed`): every projection of every batched step took it, and
the logits equal folded+fused's bit for bit; the engine and server refuse the mode off CUDA by
name. On CUDA (bench/h200/cuda_tests.sh) the kernel is checked against float32."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.folded_models import PROMPTS, load_model, padded_decode, qwen2_model

from mlxd.engine.batch import BatchConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model import folded_attention as fa
from mlxd.model import row_matmul as rm
from mlxd.model import rows_kernel as rk

cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="the kernel needs MLX-CUDA")
no_cuda = pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the mode is served")
MODE = "folded+fused+rows"


@pytest.fixture
def routed(monkeypatch) -> list[tuple[int, int]]:
    """(rows, width) of every kernel call; off CUDA the call is the plain matmul, and the
    kernel takes any weight, so the wiring runs on the CPU's float32 tiny models."""
    seen: list[tuple[int, int]] = []
    real = rk.rows_matmul

    def spy(x, w):
        seen.append((x.shape[0], w.shape[0]))
        return real(x, w) if mx.cuda.is_available() else x @ w.T

    monkeypatch.setattr(rk, "rows_matmul", spy)
    if not mx.cuda.is_available():
        monkeypatch.setattr(rk, "available", lambda: None)
        monkeypatch.setattr(rk, "supports", lambda w: True)
    return seen


def test_rows_linear_takes_only_a_batched_step(routed) -> None:
    mx.random.seed(1)
    lin = nn.Linear(64, 48, bias=True)
    mx.eval(lin.parameters())
    wrapped = rm.with_rows(type("M", (), {"p": lin})(), "p").p
    assert type(wrapped) is rm.RowsLinear
    for shape in [(1, 1, 64), (3, 5, 64), (64,)]:  # one row, a prefill chunk, a vector
        x = mx.random.normal(shape)
        assert mx.array_equal(wrapped(x), lin(x)).item()
    assert routed == []
    x = mx.random.normal((4, 1, 64))
    if not mx.cuda.is_available():
        assert mx.array_equal(wrapped(x), lin(x)).item()  # the bias is added after the product
    assert routed[-1] == (4, 48)
    assert not rm.routable(nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4))


@pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the kernel rounds otherwise")
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "qwen2"])
def test_rows_model_equals_folded_fused_bit_for_bit(arch, tiny_model, routed) -> None:
    model = qwen2_model() if arch == "qwen2" else load_model(tiny_model, arch)
    expected = padded_decode(fa.folded(model, fuse=True), 8, [0, 4, 9])
    assert routed == []
    got = padded_decode(fa.folded(model, fuse=True, rows=True), 8, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    layers = model.model.layers
    dense = sum(hasattr(lay.mlp, "gate_proj") for lay in layers)  # 0 in the tiny MoE
    per_step = 2 * len(layers) + 2 * dense + 1  # q/k/v and o a layer, gate/up and down, head
    assert len(routed) == 8 * per_step  # every decode step; the prefill took none
    assert all(rows == 3 for rows, _ in routed)
    assert routed[-1][1] == model.args.vocab_size  # the head: tied or lm_head
    assert type(model.model.embed_tokens) is nn.Embedding  # the caller's model is untouched
    assert "lm_head" not in model or type(model.lm_head) is nn.Linear
    assert all(type(lay.self_attn.o_proj) is nn.Linear for lay in layers)


def test_the_parts_knob_routes_only_the_named_projections(tiny_model, routed, monkeypatch):
    model = load_model(tiny_model, "qwen3")
    monkeypatch.setenv("MLXD_ROWS_PARTS", "o,head")
    shadow = fa.folded(model, fuse=True, rows=True)
    layer = shadow.model.layers[0]
    assert type(layer.self_attn.inner.o_proj) is rm.RowsLinear
    assert layer.self_attn.qkv.rows is None and layer.mlp._gate_up.rows is None
    assert type(layer.mlp.inner.down_proj) is nn.Linear
    assert type(shadow.model.embed_tokens) is rm.RowsEmbedding


def test_quantized_layers_keep_their_own_kernels(tiny_model, routed) -> None:
    model = load_model(tiny_model, "qwen3")
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    expected = padded_decode(fa.folded(model, fuse=True), 3, [0, 4, 9])
    got = padded_decode(fa.folded(model, fuse=True, rows=True), 3, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    assert routed == []  # every projection and the tied head are quantized


def test_a_rows_model_lists_each_weight_once(tiny_model, routed) -> None:
    from mlx.utils import tree_flatten

    model = load_model(tiny_model, "qwen3")
    plain = len(tree_flatten(fa.folded(model, fuse=True).parameters()))
    assert len(tree_flatten(fa.folded(model, fuse=True, rows=True).parameters())) == plain


def test_the_kernel_takes_half_weights_split_in_16_bytes() -> None:
    assert rk.supports(mx.zeros((4, 16), mx.bfloat16)) and rk.supports(mx.zeros((4, 8), mx.float16))
    assert not rk.supports(mx.zeros((4, 16), mx.float32))  # float32 models keep cuBLAS
    assert not rk.supports(mx.zeros((4, 12), mx.bfloat16))  # K not a multiple of 8
    assert not rk.supports(mx.zeros((2, 4, 16), mx.bfloat16))


@no_cuda
def test_the_rows_mode_is_refused_by_name_where_there_is_no_cuda(tiny_model, tmp_path) -> None:
    from mlxd.cli import build_parser
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    model = load_model(tiny_model, "qwen3")
    with pytest.raises(ValueError, match="need MLX's CUDA backend"):
        Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=MODE))
    with pytest.raises(ValueError, match="need MLX's CUDA backend"):
        fa.folded(model, fuse=True, rows=True)
    argv = ["serve", "--model", str(tiny_model("qwen3")), "--data-dir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "--batched-attention", MODE])
    with pytest.raises(ModelLoadError, match="need MLX's CUDA backend"):
        make_state(args)


@cuda
@pytest.mark.parametrize("rows", [2, 7, 8, 9, 32])
@pytest.mark.parametrize(("N", "K"), [(4096, 1024), (1023, 3072), (151936, 1024), (6144, 4096)])
def test_the_kernel_is_within_bfloat16_rounding_of_float32(rows, N, K) -> None:
    mx.random.seed(N + rows)
    w = (mx.random.normal((N, K)) * 0.02).astype(mx.bfloat16)
    x = mx.random.normal((rows, 1, K)).astype(mx.bfloat16)
    got = rk.rows_matmul(x, w).astype(mx.float32)
    want = x.astype(mx.float32) @ w.astype(mx.float32).T
    assert got.shape == (rows, 1, N)
    scale = mx.abs(want).max().item()
    assert mx.abs(got - want).max().item() <= 2 * 2**-8 * scale


@cuda
def test_an_engine_in_rows_mode_decodes_batched_rows_close_to_mlx(tiny_model, routed) -> None:
    model = load_model(tiny_model, "qwen3")
    model.set_dtype(mx.bfloat16)
    firsts = {}
    for mode in ("mlx", MODE):
        engine = Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=mode))
        try:
            reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=6) for p in PROMPTS]
            firsts[mode] = [[(e.token, e.logprobs) for e in h] for h in engine.submit_many(reqs)]
        finally:
            engine.close()
    assert routed  # the batched steps went through the kernel
    for a, b in zip(firsts["mlx"], firsts[MODE], strict=True):
        assert len(a) == len(b) == 6
        assert a[0][0] == b[0][0]  # the prefill's token: the same path in both modes
        for (ta, la), (tb, lb) in zip(a[1:], b[1:], strict=True):
            assert mx.abs(la - lb).max().item() < 0.05
            if ta != tb:  # a near-tie took another token: the contexts differ from here
                break
