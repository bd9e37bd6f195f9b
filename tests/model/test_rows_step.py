"""The folded modes' step over 2-D rows (mlxd/model/rows_step.py): the same bits as the 3-D
step it replaces, with fewer view nodes in the graph (what it is for: host time a step).

The 3-D step is `folded(..., rows=False)`, kept for this comparison and the device probes. On
the CPU both also equal the caller's model (test_folded_attention.py checks the default);
on MLX-CUDA this file is the check that the rows step keeps the 3-D step's kernels and bits
(bench/h200/cuda_tests.sh)."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from fixtures.folded_models import count_rows_calls, load_model, padded_decode
from mlx_lm.models.cache import BatchKVCache

from bench.probes.probe_ops import VIEWS, primitives
from mlxd.model import folded_attention as fa
from mlxd.model import row_gemv as rg
from mlxd.model import rows_step as rs


@pytest.fixture
def rows_calls(monkeypatch) -> list[int]:
    """Counts the folded rows step's attention calls."""
    return count_rows_calls(monkeypatch, fa.FoldedAttention)


@pytest.mark.parametrize("fuse", [False, True], ids=["folded", "folded+fused"])
@pytest.mark.parametrize("align", [1, 8])
def test_the_rows_step_equals_the_3d_step_bit_for_bit(model, fuse, align, rows_calls) -> None:
    three_d = padded_decode(fa.folded(model, align, fuse=fuse, rows=False), 8, [0, 4, 9])
    assert rows_calls == []
    rows = padded_decode(fa.folded(model, align, fuse=fuse), 8, [0, 4, 9])
    assert len(rows_calls) == 8 * len(model.layers)  # every decode step, every layer
    assert mx.array_equal(rows, three_d).item()


def test_the_gemv_mode_steps_on_rows_with_the_same_bits(tiny_model, monkeypatch) -> None:
    monkeypatch.setattr(rg, "MAX_BYTES", 1 << 30)  # the tiny weights all routed
    model = load_model(tiny_model, "qwen3")
    monkeypatch.setenv("MLXD_GEMV_PARTS", "qkv,o,gate_up,down,qk")
    three_d = padded_decode(fa.folded(model, fuse=True, gemv=True, rows=False), 6, [0, 4, 9])
    rows = padded_decode(fa.folded(model, fuse=True, gemv=True), 6, [0, 4, 9])
    assert mx.array_equal(rows, three_d).item()
    layer = fa.folded(model, fuse=True, gemv=True).model.layers[0]
    assert type(layer.self_attn.proj.o) is rg.GemvLinear  # the rows step's o_proj: the gemv


def _step_graph(shadow, rows: int = 3):
    """The primitives of one batched decode step after a warm-up step (held arrays evaluated)."""
    caches = [BatchKVCache([0] * rows) for _ in shadow.layers]
    mx.eval(shadow(mx.zeros((rows, 4), mx.int32), cache=caches))
    mx.eval(shadow(mx.zeros((rows, 1), mx.int32), cache=caches))
    return primitives(shadow(mx.zeros((rows, 1), mx.int32), cache=caches))


def test_the_rows_step_drops_the_per_layer_views(tiny_model) -> None:
    """What the rows step is for. Counted by hand from the code: in the 3-D step a layer holds
    4 Flatten/Unflatten pairs (q/k/v, o, gate/up and down as 3-D matmuls) and 9 Transposes (4
    weights, q/k/v's heads, the output's heads, the keys' swapaxes); over rows only the output
    head's remain (1 Flatten, 1 Unflatten, 1 Transpose) beside each layer's swapaxes."""
    model = load_model(tiny_model, "qwen3")
    n = len(model.layers)
    three_d = _step_graph(fa.folded(model, fuse=True, rows=False))
    rows = _step_graph(fa.folded(model, fuse=True))
    assert three_d["Flatten"] == 4 * n + 1 and three_d["Unflatten"] == 4 * n + 1
    assert rows["Flatten"] == 1 and rows["Unflatten"] == 1
    assert three_d["Transpose"] == 9 * n + 1
    assert rows["Transpose"] == n + 1
    # the scale and the mask's fill are held: fewer Broadcasts by 2 a layer, minus 1 a step
    assert three_d["Broadcast"] - rows["Broadcast"] >= 2 * n - 1
    ops = {k: v for k, v in rows.items() if k not in VIEWS}
    assert ops == {k: v for k, v in three_d.items() if k not in VIEWS}  # the same ops


def test_a_held_linear_is_the_linear_bit_for_bit() -> None:
    mx.random.seed(2)
    x = mx.random.normal((5, 64)).astype(mx.bfloat16)
    for bias in (False, True):
        lin = nn.Linear(64, 96, bias=bias)
        lin.set_dtype(mx.bfloat16)
        held = rs.held(lin)
        assert type(held) is rs.HeldLinear
        for shape in ((5, 64), (5, 1, 64)):
            assert mx.array_equal(held(x.reshape(shape)), lin(x.reshape(shape))).item()
    q = nn.QuantizedLinear.from_linear(nn.Linear(64, 96), group_size=32, bits=4)
    assert rs.held(q) is q  # quantized kernels take the weight as it is


def test_a_block_kind_it_does_not_know_keeps_its_class() -> None:
    class Block(nn.Module):
        pass

    b = Block()
    assert type(rs.rows_block(b)) is Block
