"""The device probes behind docs/performance.md run end to end (tiny shapes, CPU). On the CPU
MLX's masked attention is the fallback formula, so folded attention must report bit-equal."""

import os
import re
from typing import Any

import pytest

from bench.probes import (
    probe_attention,
    probe_compile,
    probe_graphs,
    probe_join,
    probe_join_race,
    probe_matmul,
    probe_overhead,
)


def test_probe_attention_prints_each_variant_and_whole_steps(capsys) -> None:
    probe_attention.main(["--shape", "qwen3-host", "--rows", "2", "--contexts", "64"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.search(r"masked \(MLX\) +[\d.]+ ms \| no mask +[\d.]+ \| folded +[\d.]+", lines[0])
    assert "bit-equal to masked: True" in lines[0]
    assert re.search(r"B= 2 L=   64 whole step +[\d.]+ ms", lines[1])


@pytest.mark.parametrize("attention", ["mlx", "folded+fused"])
def test_probe_join_times_every_part_three_times(capsys, attention: str) -> None:
    """Plain, and with a --batched-attention mode's model (its prefill, first step)."""
    args = ["--shape", "qwen3-host", "--rows", "3", "--cached", "40", "--new", "8"]
    probe_join.main([*args, "--attention", attention])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["repeat 0", "repeat 1", "repeat 2"]
    for line in lines:
        parts = dict(re.findall(r"(\w+) ([\d.]+) ms", line))
        assert set(parts) == {
            "merge", "prefill", "clear_cache", "finalize", "finalize_by_slices", "decode_step",
            "prefill_row_by_row", "batch_generator", "batch_generator_mlxd_caches",
        }  # fmt: skip
        assert all(float(v) >= 0 for v in parts.values())
        assert "finalize_by_slices_equal True" in line  # mlxd's roll left mlx-lm's arrays


def test_probe_join_watches_each_timed_part_in_order() -> None:
    """--kernels profiles these parts on the device; here a recording watch sees them."""
    import contextlib

    from mlxd.bench.models import build_random

    seen: list[str] = []

    @contextlib.contextmanager
    def watch(part: str):
        seen.append(part)
        yield

    model = build_random("qwen3-host", "bfloat16", 0).model
    for ours in (False, True):  # --caches mlx / mlxd: the timed merge builds mlx-lm's / ours
        seen.clear()
        merged: list[type] = []
        merge = probe_join._merge_caches

        def spy(caches: list, merged: list = merged, merge: Any = merge) -> list:
            out = merge(caches)
            merged.append(type(out[0]))
            return out

        probe_join._merge_caches = spy
        try:
            parts = probe_join.join_once(model, 3, 40, 8, 3, 3, watch, ours)
        finally:
            probe_join._merge_caches = merge
        assert seen == ["merge", "prefill", "roll", "decode_step"]
        assert {"merge", "prefill", "finalize_by_slices", "decode_step"} <= set(parts)
        assert merged[0].__name__ == ("RollingBatchKVCache" if ours else "BatchKVCache")


def test_probe_matmul_prints_each_shape_and_whole_steps(capsys) -> None:
    probe_matmul.main(["--shape", "qwen3-host", "--rows", "1", "2", "--contexts", "64"])
    lines = capsys.readouterr().out.splitlines()
    sweep = [line for line in lines if re.match(r"\S+ +N= *\d+ K= *\d+ M= [12]: +[\d.]+ ms", line)]
    assert len(sweep) == 8 * 2  # q, k/v, o, gate/up, down, the stacked qkv, gate_up, the head
    steps = [line for line in lines if "whole step" in line]
    assert len(steps) == 2 and all(line.count("whole step") == 2 for line in steps)


@pytest.mark.parametrize("step", ["argmax", "engine"])
def test_probe_graphs_times_each_variant_per_row_count(capsys, step: str) -> None:
    args = ["--shape", "qwen3-host", "--rows", "2", "--context", "40", "--steps", "8"]
    probe_graphs.main([*args, "--step", step])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    cell = r" +[\d.]+"
    want = rf"step={step} B= 2 L=   40\+8: mlx{cell} \| folded/8{cell} \| folded/256{cell} ms/step"
    assert re.search(want, lines[0])


def test_probe_overhead_splits_mlxds_per_token_time(capsys) -> None:
    from mlxd.engine.serial import SerialRow

    decode = SerialRow.decode
    probe_overhead.main(["--layers", "1", "--rounds", "3", "--prompt-tokens", "8",
                         "--gen-tokens", "10"])  # fmt: skip
    assert SerialRow.decode is decode  # the timer is gone again
    lines = capsys.readouterr().out.splitlines()
    sides = ["mlx-lm", "mlxd", "mlxd/mlx-step", "mlxd/fused"]
    per = [float(re.match(rf"{side}: ([\d.]+) us per token \[", line)[1])
           for side, line in zip(sides, lines, strict=False)]  # fmt: skip
    assert len(per) == 4
    pairs = ["mlx-lm/mlxd", "mlx-lm/mlxd/mlx-step", "mlxd/mlx-step/mlxd", "mlxd/mlxd/fused"]
    for pair, line in zip(pairs, lines[4:8], strict=True):
        assert re.fullmatch(rf"per-round speed ratio {pair} [\d.]+ \[[\d.]+-[\d.]+\]", line)
    outside = re.fullmatch(r"mlxd outside SerialRow.decode: ([\d.]+) us per token", lines[8])
    assert 0 < float(outside[1]) < per[1]


def test_probe_compile_times_each_variant_and_compares_the_compiled_tokens(capsys) -> None:
    probe_compile.main(
        ["--shape", "qwen3-host", "--rows", "1", "2", "--context", "40", "--steps", "8"]
    )
    lines = capsys.readouterr().out.splitlines()
    cell = r" +[\d.]+"
    assert re.search(
        rf"B= 1 L=   40\+8: mlx-lm{cell} \| static{cell} \| static\+compile{cell}", lines[0]
    )
    want = rf"B= 2 .*mlx-lm{cell} \| folded{cell} \| folded\+fused{cell} \| static{cell} \| static"
    assert re.search(want, lines[1])
    assert all(line.endswith("| equal True") for line in lines) and len(lines) == 2


def test_probe_ops_counts_a_steps_primitives_for_each_mode(capsys) -> None:
    from bench.probes import probe_ops

    probe_ops.main(["--shape", "qwen3-host", "--rows", "2", "--context", "24", "--steps", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("qwen3-host, 2 rows x 24 keys")
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == ["mlx", "folded", "folded+fused", "folded+fused+gemv"]
    matmuls = {}
    for mode, line in rows.items():
        cells = r"build +([\d.]+) ms, \+encode +([\d.]+) ms, build\+eval +([\d.]+)"
        m = re.search(r"ops +(\d+) views +(\d+) \| " + cells, line)
        assert m and int(m[1]) > 0 and float(m[5]) >= float(m[4]) >= float(m[3]) > 0
        matmuls[mode] = int(re.search(r"Matmul (\d+)", line)[1])
    # 28 layers: 7 projections + 2 attention matmuls each, and the LM head; fusing q/k/v and
    # gate/up leaves 4 projections a layer (the gemv's are batched Matmuls too).
    fused = 28 * 6 + 1
    assert matmuls == {
        "mlx": 28 * 9 + 1, "folded": 28 * 9 + 1, "folded+fused": fused, "folded+fused+gemv": fused
    }  # fmt: skip
    views = {mode: int(re.search(r"views +(\d+)", line)[1]) for mode, line in rows.items()}
    # over 2-D rows (model/rows_step.py) a projection takes no view, a gemv two (rows as
    # vectors and back)
    assert views["folded+fused+gemv"] == views["folded+fused"] + 28 * 4 * 2
    # mlx-lm's attention over rows (model/plain_rows.py) keeps the CPU fallback's own views,
    # the 3-D step has 23 more a layer (7 projections' Flatten, Transpose and Unflatten, 4
    # heads' transposes; less the rows step's reshape of the block's input and output)
    probe_ops.main(["--shape", "qwen3-host", "--rows", "2", "--context", "24", "--steps", "2",
                    "--modes", "mlx", "mlx/3d"])  # fmt: skip
    plain = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    count = {mode: int(re.search(r"views +(\d+)", line)[1]) for mode, line in plain.items()}
    assert count["mlx/3d"] - count["mlx"] == 28 * 23


def test_probe_ops_alternates_modes_block_by_block(capsys) -> None:
    from bench.probes import probe_ops

    argv = ["--shape", "qwen3-host", "--rows", "2", "--context", "24", "--steps", "2"]
    modes = ["folded+fused", "folded+fused+gemv", "folded+fused+gemv@qkv,qk"]
    probe_ops.main([*argv, "--alternate", "3", "--modes", *modes])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "qwen3-host, 2 rows x 24 keys, 3 blocks"
    assert lines[3].startswith("folded+fused+gemv@qkv,qk whole step")
    assert "MLXD_GEMV_PARTS" not in os.environ  # the parts were set only while building
    pat = r"whole step +([\d.]+) ms \[([\d.]+)-([\d.]+)\] \| against folded\+fused: ([\d.]+)x"
    first, second = (re.search(pat, line) for line in lines[1:3])
    assert lines[1].startswith("folded+fused ") and lines[2].startswith("folded+fused+gemv ")
    assert first[4] == "1.000"  # each block against itself
    for m in (first, second):
        assert float(m[2]) <= float(m[1]) <= float(m[3])


def test_probe_ops_builds_a_gemv_mode_with_the_named_parts(monkeypatch) -> None:
    from bench.probes import probe_ops
    from mlxd.bench.models import build_random
    from mlxd.model import row_gemv

    model = build_random("qwen3-host", "bfloat16").model
    layer = probe_ops.model_for(model, "folded+fused+gemv@o,qk").model.layers[0]
    assert (
        layer.self_attn.gemv_qk_rows == 8
        and type(layer.self_attn.inner.o_proj) is row_gemv.GemvLinear
    )
    assert layer.self_attn.qkv.gemv is None
    monkeypatch.setenv("MLXD_GEMV_PARTS", "qkv")  # restored afterwards, not dropped
    probe_ops.model_for(model, "folded+fused+gemv@o")
    assert os.environ["MLXD_GEMV_PARTS"] == "qkv"
    with pytest.raises(ValueError):
        probe_ops._mode("folded+fused@qk")  # parts only for a +gemv mode


def test_probe_ops_suffixes_pick_the_3d_step_and_per_layer_offsets() -> None:
    from bench.probes import probe_ops
    from mlxd.bench.models import build_random
    from mlxd.model.rows_step import RowsStep

    assert probe_ops._parse("folded+fused+gemv@o/3d/per-layer-offsets") == (
        "folded+fused+gemv", "o", False, False
    )  # fmt: skip
    assert probe_ops._parse("folded+fused") == ("folded+fused", "", True, True)
    assert probe_ops._parse("folded/per-layer-offsets") == ("folded", "", False, True)
    model = build_random("qwen3-host", "bfloat16").model
    assert isinstance(probe_ops.model_for(model, "folded+fused").model.layers[0], RowsStep)
    three_d = probe_ops.model_for(model, "folded+fused/3d").model.layers[0]
    assert not isinstance(three_d, RowsStep) and three_d.self_attn.qkv is not None
    # mlx: mlxd's step over rows (model/plain_rows.py); mlx/3d: mlx-lm's model as it is
    assert isinstance(probe_ops.model_for(model, "mlx").model.layers[0], RowsStep)
    assert probe_ops.model_for(model, "mlx/3d") is model
    with pytest.raises(ValueError):
        probe_ops._mode("folded+fused/per-layer-offsets/3d")  # the suffixes' order is fixed


def test_primitives_counts_each_op_once() -> None:
    import mlx.core as mx

    from bench.probes.probe_ops import primitives

    a = mx.ones((2, 3))
    counts = primitives(((a * 2) + (a * 3)).sum())
    assert counts["Multiply"] == 2 and counts["Add"] == 1 and counts["Sum"] == 1


def test_neighbours_names_each_ops_producers_and_consumers(capsys) -> None:
    import mlx.core as mx

    from bench.probes import probe_ops

    a = mx.ones((2, 3))
    mx.eval(a)  # evaluated: its op is gone, so it reads as a source
    joined = mx.concatenate([a * 2, mx.zeros((2, 1))], axis=1)
    found = probe_ops.neighbours({"Concatenate", "Full"}, mx.exp(joined), joined.sum())
    assert found == {
        "Multiply, Full > Concatenate > Exp, Sum": 1,
        "Broadcast/source > Full > Concatenate": 1,  # mx.zeros: a broadcast scalar, filled
    }
    probe_ops.main(["--shape", "qwen3-host", "--rows", "2", "--context", "24", "--steps", "2",
                    "--modes", "folded", "--neighbours", "Select"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    # the padding mask (built once a step: BitwiseAnd) selects scores or -inf in each layer
    assert lines[2:] == [
        "      28  Broadcast/BitwiseAnd, Matmul, Broadcast/source > Select > Softmax"
    ]


def test_probe_new_rows_times_first_and_warm_steps_per_pass(capsys) -> None:
    from bench.probes import probe_new_rows

    args = ["--shape", "qwen3-host", "--rows", "4", "2", "--context", "24", "30", "--steps", "2"]
    probe_new_rows.main(args)
    gathers, _, *lines = capsys.readouterr().out.splitlines()
    each = r"(\w+) [\d.]+ / [\d.]+ ms"
    assert re.fullmatch(rf"first gathers, first / again: {each}(, {each})*", gathers)
    assert re.findall(r"(\w+) [\d.]+ /", gathers) == ["uint32", "int32", "float32", "bfloat16"]
    assert [line.split(":")[0] for line in lines] == [
        f"pass {n} rows {r:3d} keys {k:5d}" for n in (1, 2) for k in (24, 30) for r in (4, 2)
    ]
    step = r"caches +[\d.]+ ms, first step +[\d.]+ ms, warm +[\d.]+ ms"
    leave = r"; a layer's leave from 4: +[\d.]+ ms, equal True; every layer's: +[\d.]+ ms$"
    for x in lines:  # leaves below the top row count, at the first context only
        assert re.search(step + (leave if "rows   2 keys    24" in x else "$"), x), x


@pytest.mark.parametrize("unsettled", [False, True])
def test_probe_join_race_counts_the_steps_at_risk_and_puts_the_engine_back(
    capsys, unsettled: bool
) -> None:
    """Joiners prefilled in chunks while the encoder's floor of rows steps on it: a line per
    cycle with the steps at risk (a step handed to the encoder with a prefill after it), and the
    engine's own rule restored after the run, whichever way it ran."""
    from mlxd.config import THREAD_ROWS
    from mlxd.engine import batch
    from mlxd.engine import rows as engine_rows

    real = batch.evaluates_after_step
    args = ["--shape", "qwen3-host", "--cycles", "2", "--running", str(THREAD_ROWS)]
    args += ["--joining", "2"]
    args += ["--short", "8", "--long", "40", "--step-size", "16", "--gen", "8"]
    probe_join_race.main([*args, *(["--unsettled"] if unsettled else [])])
    lines = capsys.readouterr().out.splitlines()
    mode = "unsettled" if unsettled else "settled"
    risks = [int(m.group(1)) for x in lines if (m := re.search(r"steps at risk (\d+)", x))]
    assert [x.split(":")[0] for x in lines] == [f"{mode} cycle 0", f"{mode} cycle 1", mode]
    assert 0 < risks[0] < risks[1]  # counted in each cycle
    assert batch.evaluates_after_step is real and engine_rows.evaluates_after_step is real
