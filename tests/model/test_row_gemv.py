"""The `+gemv` mode of `--batched-attention` (mlxd/model/row_gemv.py): a batched decode step's
small projections as MLX's batched gemv (the weight broadcast over the rows) instead of one
cuBLASLt matmul.

On the CPU both forms reduce each output in the same order, so the mode must equal
folded+fused bit for bit there (that is what these tests hold it to); on CUDA the gemv kernel's
float32 sums round otherwise, so it is opt-in and checked against float32
(bench/h200/cuda_tests.sh)."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.folded_models import PROMPTS, engine_runs, load_model, padded_decode, qwen2_model

from mlxd.model import folded_attention as fa
from mlxd.model import row_gemv as rg

cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="the rounding check is CUDA's")
MODE = "folded+fused+gemv"


@pytest.fixture
def routed(monkeypatch) -> list[tuple[int, int]]:
    """(rows, width) of every batched-gemv call."""
    seen: list[tuple[int, int]] = []
    real = rg.GemvMatmul.__call__

    def spy(self, x):
        seen.append((x.shape[0], self.weight.shape[0]))
        return real(self, x)

    monkeypatch.setattr(rg.GemvMatmul, "__call__", spy)
    return seen


def test_gemv_linear_takes_only_a_batched_step_up_to_its_row_cap(routed, monkeypatch) -> None:
    mx.random.seed(1)
    lin = nn.Linear(64, 48, bias=True)
    mx.eval(lin.parameters())
    monkeypatch.setenv("MLXD_GEMV_ROWS", "4")
    wrapped = rg.with_gemv(type("M", (), {"p": lin})(), "p").p
    assert type(wrapped) is rg.GemvLinear
    for shape in [(1, 1, 64), (3, 5, 64), (64,), (5, 1, 64)]:  # lone row, chunk, vector, > cap
        x = mx.random.normal(shape)
        assert mx.array_equal(wrapped(x), lin(x)).item()
    assert routed == []
    x = mx.random.normal((4, 1, 64))
    got, want = wrapped(x), lin(x)
    if mx.cuda.is_available():  # the gemv's float32 sums against cuBLAS's (TF32) product
        assert mx.abs(got - want).max().item() < 1e-2 * mx.abs(want).max().item()
    else:
        assert mx.array_equal(got, want).item()  # the bias is added after the product
    assert routed == [(4, 48)]
    assert not rg.routable(nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4))


def test_a_weight_over_the_byte_cap_keeps_cublas(monkeypatch) -> None:
    lin = nn.Linear(64, 48)
    assert rg.routable(lin)
    monkeypatch.setattr(rg, "MAX_BYTES", lin.weight.nbytes - 1)
    assert not rg.routable(lin)


@pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the gemv rounds otherwise")
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "qwen2"])
def test_gemv_model_equals_folded_fused_bit_for_bit(arch, tiny_model, routed, monkeypatch):
    monkeypatch.setenv("MLXD_GEMV_PARTS", ",".join(rg.PARTS))  # the head as well
    model = qwen2_model() if arch == "qwen2" else load_model(tiny_model, arch)
    expected = padded_decode(fa.folded(model, fuse=True), 8, [0, 4, 9])
    assert routed == []
    got = padded_decode(fa.folded(model, fuse=True, gemv=True), 8, [0, 4, 9])
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


def test_the_parts_knob_routes_only_the_named_projections(tiny_model, monkeypatch) -> None:
    model = load_model(tiny_model, "qwen3")
    shadow = fa.folded(model, fuse=True, gemv=True)  # default: all but the head
    layer = shadow.model.layers[0]
    assert type(layer.self_attn.inner.o_proj) is rg.GemvLinear
    assert layer.self_attn.qkv.gemv is not None and layer.mlp._gate_up.gemv is not None
    assert type(layer.mlp.inner.down_proj) is rg.GemvLinear
    assert type(shadow.model.embed_tokens) is nn.Embedding and layer.self_attn.gemv_qk_rows == 0
    monkeypatch.setenv("MLXD_GEMV_PARTS", "o,head")
    layer = (shadow := fa.folded(model, fuse=True, gemv=True)).model.layers[0]
    assert type(layer.self_attn.inner.o_proj) is rg.GemvLinear
    assert layer.self_attn.qkv.gemv is None and layer.mlp._gate_up.gemv is None
    assert type(layer.mlp.inner.down_proj) is nn.Linear
    assert type(shadow.model.embed_tokens) is rg.GemvEmbedding


@pytest.mark.skipif(mx.cuda.is_available(), reason="on CUDA the gemv rounds otherwise")
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_attention_scores_as_gemvs_keep_the_bits(arch, tiny_model, monkeypatch) -> None:
    """MLXD_GEMV_PARTS=qk: each layer's q.k scores as gemvs over the keys broadcast across the
    query group, in every batched decode step up to the row cap, with folded+fused's logits."""
    calls: list[tuple] = []
    real = rg.scores
    monkeypatch.setattr(rg, "scores", lambda q, k: calls.append(q.shape) or real(q, k))
    monkeypatch.setenv("MLXD_GEMV_PARTS", "qk")
    model = qwen2_model() if arch == "qwen2" else load_model(tiny_model, arch)
    expected = padded_decode(fa.folded(model, fuse=True), 5, [0, 4, 9])
    assert calls == []
    got = padded_decode(fa.folded(model, fuse=True, gemv=True), 5, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    assert len(calls) == 5 * len(model.model.layers) and all(c[0] == 3 for c in calls)
    monkeypatch.setenv("MLXD_GEMV_ROWS", "2")  # 3 rows: over the cap, the matmul again
    calls.clear()
    padded_decode(fa.folded(model, fuse=True, gemv=True), 2, [0, 4, 9])
    assert calls == []


def test_quantized_layers_keep_their_own_kernels(tiny_model, routed) -> None:
    model = load_model(tiny_model, "qwen3")
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    expected = padded_decode(fa.folded(model, fuse=True), 3, [0, 4, 9])
    got = padded_decode(fa.folded(model, fuse=True, gemv=True), 3, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    assert routed == []  # every projection is quantized


def test_a_gemv_model_lists_each_weight_once(tiny_model) -> None:
    from mlx.utils import tree_flatten

    model = load_model(tiny_model, "qwen3")
    plain = len(tree_flatten(fa.folded(model, fuse=True).parameters()))
    assert len(tree_flatten(fa.folded(model, fuse=True, gemv=True).parameters())) == plain


def test_an_engine_in_gemv_mode_keeps_folded_fused_bits_on_the_cpu_close_on_cuda(
    tiny_model, routed
):
    model = load_model(tiny_model, "qwen3")
    runs = engine_runs(model, ("folded+fused", MODE), PROMPTS)
    assert routed  # the batched steps went through the gemv
    for a, b in zip(runs["folded+fused"], runs[MODE], strict=True):
        assert len(a) == len(b) == 6
        for (ta, la), (tb, lb) in zip(a, b, strict=True):
            if not mx.cuda.is_available():
                assert ta == tb and mx.array_equal(la, lb).item()
                continue
            assert mx.abs(la - lb).max().item() < 0.05  # CUDA: the gemv's own rounding
            if ta != tb:  # a near-tie took another token: the contexts differ from here
                break


@cuda
@pytest.mark.parametrize("rows", [2, 7, 8, 16])
@pytest.mark.parametrize(("N", "K"), [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)])
def test_the_batched_gemv_is_within_bfloat16_rounding_of_float32(rows, N, K) -> None:
    mx.random.seed(N + rows)
    w = (mx.random.normal((N, K)) * 0.02).astype(mx.bfloat16)
    x = mx.random.normal((rows, 1, K)).astype(mx.bfloat16)
    got = rg.GemvMatmul(w, cap=32)(x).astype(mx.float32)
    want = x.astype(mx.float32) @ w.astype(mx.float32).T
    assert got.shape == (rows, 1, N)
    scale = mx.abs(want).max().item()
    assert mx.abs(got - want).max().item() <= 2 * 2**-8 * scale


@cuda
@pytest.mark.parametrize("rows", [2, 8])
@pytest.mark.parametrize(("n_kv", "group", "keys"), [(8, 2, 4096), (8, 4, 4096), (2, 7, 33)])
def test_the_gemv_scores_are_within_bfloat16_rounding_of_float32(rows, n_kv, group, keys):
    mx.random.seed(rows + keys)
    q = mx.random.normal((rows, n_kv, group, 128)).astype(mx.bfloat16)
    buf = mx.random.normal((rows, n_kv, keys + 8, 128)).astype(mx.bfloat16)
    k = buf[..., :keys, :]  # a slice of the cache's buffer, as the step reads it
    got = rg.scores(q, k).astype(mx.float32)
    want = q.astype(mx.float32) @ k.astype(mx.float32).swapaxes(-1, -2)
    assert got.shape == (rows, n_kv, group, keys)
    assert mx.abs(got - want).max().item() <= 2 * 2**-8 * mx.abs(want).max().item()
