"""`--batched-attention folded+fused` (mlxd/model/fused_projections.py): the batched decode step
runs q/k/v and gate/up as one matmul each over stacked weights.

On the CPU a stacked matmul computes each output column as the separate one does, so the mode
must equal folded attention (and so BatchGenerator) bit for bit there; on CUDA another kernel
shape may round otherwise, which is why it is opt-in."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from fixtures.folded_models import PROMPTS, load_model, padded_decode

from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model import folded_attention as fa
from mlxd.model import fused_projections as fp


@pytest.fixture
def stacked_calls(monkeypatch) -> list[int]:
    """Counts the stacked matmuls (so a test sees the fused path ran)."""
    seen: list[int] = []
    real = fp.Stacked.__call__

    def spy(self, x):
        seen.append(len(self.edges) + 1)
        return real(self, x)

    monkeypatch.setattr(fp.Stacked, "__call__", spy)
    return seen


def _linears(kind: str, widths: list[int]) -> list[nn.Module]:
    mx.random.seed(5)
    layers = [nn.Linear(64, w, bias=kind == "bias") for w in widths]
    if kind == "4bit":
        layers = [nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4) for lin in layers]
    mx.eval([lin.parameters() for lin in layers])
    return layers


@pytest.mark.parametrize("kind", ["plain", "bias", "4bit"])
@pytest.mark.parametrize("shape", [(3, 1, 64), (2, 5, 64)])
def test_one_stacked_matmul_equals_each_layer(kind: str, shape: tuple[int, ...]) -> None:
    layers = _linears(kind, [64, 16, 16])
    x = mx.random.normal(shape).astype(mx.bfloat16)
    got = fp.Stacked(layers)(x)
    assert [g.shape[-1] for g in got] == [64, 16, 16]
    assert all(mx.array_equal(g, lin(x)).item() for g, lin in zip(got, layers, strict=True))


def test_only_layers_of_one_kind_stack() -> None:
    plain, bias, quant = (_linears(k, [16])[0] for k in ("plain", "bias", "4bit"))
    assert fp.stackable([plain, _linears("plain", [32])[0]])
    assert not fp.stackable([plain, bias])
    assert not fp.stackable([plain, quant])
    eight = nn.QuantizedLinear.from_linear(_linears("plain", [16])[0], group_size=32, bits=8)
    assert not fp.stackable([quant, eight])
    assert fp.stacked_qkv(object()) is None  # no q/k/v projections: the layer stays unfused


def test_fused_model_equals_the_folded_one_bit_for_bit(model, stacked_calls) -> None:
    expected = padded_decode(fa.folded(model), 8, [0, 4, 9])
    assert stacked_calls == []
    fused = fa.folded(model, fuse=True)
    got = padded_decode(fused, 8, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    layers = len(model.layers)
    dense = sum(hasattr(lay.mlp, "gate_proj") for lay in model.model.layers)  # 0 in tiny MoE
    assert dense == sum(isinstance(lay.mlp, fp.FusedMLP) for lay in fused.model.layers)
    assert stacked_calls.count(3) == 8 * layers  # q/k/v: every decode step, every layer
    assert stacked_calls.count(2) == 8 * dense  # gate/up in every dense MLP
    assert type(model.model.layers[0].self_attn).__name__ == "Attention"  # the caller's model
    assert not isinstance(model.model.layers[0].mlp, fp.FusedMLP)


def test_engine_with_fused_projections_equals_batch_generator_on_cpu(
    tiny_model, stacked_calls
) -> None:
    model = load_model(tiny_model, "qwen3")
    expected = batch_generator_outputs(model, PROMPTS, 12, frozenset())
    engine = Engine(model, config=EngineConfig(8, 8, 2048, attention="folded+fused"))
    try:
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=12) for p in PROMPTS]
        for handle, ref in zip(engine.submit_many(reqs), expected, strict=True):
            got = [(e.token, e.logprobs) for e in handle]
            assert [t for t, _ in got] == [t for t, _ in ref]
            assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, ref, strict=True))
    finally:
        engine.close()
    assert stacked_calls  # the batched decode went through the stacked matmuls


def test_serve_takes_the_mode_and_refuses_an_unknown_architecture(tiny_model, tmp_path) -> None:
    from mlxd.cli.serve import parse_config
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    def args(arch: str, mode: str = "folded+fused"):
        flags = ["--model", str(tiny_model(arch)), "--data-dir", str(tmp_path / arch / mode)]
        flags += ["--memory-budget", "1GB", "--batched-attention", mode]
        return parse_config(flags)

    budgets = {}
    for mode in ("folded", "folded+fused"):
        state = make_state(args("qwen3", mode))
        try:
            engine = state.provider.default.engine
            assert engine.config.attention == mode
            budgets[mode] = engine.kv_budget
        finally:
            state.provider.close()
    assert budgets["folded"] == budgets["folded+fused"]  # the stacks take no memory of their own
    with pytest.raises(ModelLoadError, match="this model is 'gemma3_text'"):
        make_state(args("gemma3"))


def test_the_stacks_replace_the_weights_in_place(tiny_model) -> None:
    """After folded(fuse=True) and a rows+fused twin, each layer reads its rows of the stacks:
    the same values, and MLX's active memory has not grown by the stacks' size (copies would)."""
    import gc

    import numpy as np

    from mlxd.model import plain_rows as pr

    model = load_model(tiny_model, "qwen3")
    mx.eval(model.parameters())
    attn = model.layers[0].self_attn
    values = [np.array(p.weight) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    gc.collect()
    before = mx.get_active_memory()
    assert fp.stack_in_place(model) == 0  # no copy for a budget to count
    batch, lone = fa.folded(model, fuse=True), pr.plain_rows(model, fuse=True)
    gc.collect()
    grown = mx.get_active_memory() - before
    stacks = [
        a
        for layer in batch.model.layers
        for st in (layer.self_attn.qkv, layer.mlp._gate_up)
        for a in st.arrays.values()
    ]
    stacked = sum(a.nbytes for a in stacks)
    assert stacked > 0 and grown < stacked / 10, (grown, stacked)
    qkv = batch.model.layers[0].self_attn.qkv
    assert qkv.arrays["weight"] is lone.model.layers[0].self_attn.qkv.arrays["weight"]
    assert fp.stack_in_place(model) == 0
    assert qkv.arrays["weight"] is fp.stacked_qkv(attn).arrays["weight"]  # nothing restacked
    start = 0
    for p, v in zip((attn.q_proj, attn.k_proj, attn.v_proj), values, strict=True):
        assert np.array_equal(np.array(p.weight), v)
        rows = qkv.arrays["weight"][start : start + v.shape[0]]
        assert mx.array_equal(rows, p.weight).item()
        start += v.shape[0]


def test_slices_that_would_start_off_the_allocators_alignment_stay_apart() -> None:
    """fp32 rows of 12 bytes: the second layer's slice would start at byte 60, not a multiple
    of 256, so each layer keeps its own array beside the stack; so do layers of mixed dtypes."""
    layers = [nn.Linear(3, w) for w in (5, 7)]
    mx.eval([lin.parameters() for lin in layers])
    own = [lin.weight for lin in layers]
    st = fp.Stacked(layers)
    assert all(lin.weight is w for lin, w in zip(layers, own, strict=True))
    assert mx.array_equal(st.arrays["weight"], mx.concatenate(own)).item()
    attn = nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = (nn.Linear(3, w) for w in (5, 7, 7))
    layer = nn.Module()
    layer.self_attn, layer.mlp = attn, nn.Identity()
    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = [layer]
    copy = sum(x.nbytes for x in (*attn.q_proj.parameters().values(),
                                  *attn.k_proj.parameters().values(),
                                  *attn.v_proj.parameters().values()))  # fmt: skip
    assert fp.stack_in_place(model) == copy  # a copy beside the layers: the budget counts it
    mixed = _linears("plain", [64, 16])
    mixed[1].weight = mixed[1].weight.astype(mx.bfloat16)
    own = [lin.weight for lin in mixed]
    fp.Stacked(mixed)  # a float32 stack: the bfloat16 layer must not read float32 rows
    assert all(lin.weight is w for lin, w in zip(mixed, own, strict=True))
    aligned = _linears("plain", [64, 16])  # rows of 256 bytes: the layers read the stack
    before = [lin.weight for lin in aligned]
    st = fp.Stacked(aligned)
    assert all(lin.weight is not w for lin, w in zip(aligned, before, strict=True))
    assert mx.array_equal(st.arrays["weight"], mx.concatenate(before)).item()
