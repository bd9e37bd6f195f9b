"""`mlxd bench generate` end to end on the tiny random shape: both sides, ratios, identical
greedy tokens. A benchmark, not a timed test: nothing here asserts a speed."""

import json
import re
from pathlib import Path

import pytest

from mlxd.bench.report import (
    CONCURRENT_METRICS,
    SINGLE_METRICS,
    consistency,
    first_divergence,
    pooled_steps,
)
from mlxd.cli import main


def test_bench_generate_tiny_through_the_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "generate", "--random-shape", "tiny", "--dtype", "float32"]
    argv += ["--prompt-tokens", "12", "--gen-tokens", "6", "--rounds", "2", "--concurrent", "2"]
    main([*argv, "--json", str(out)])  # returns normally: no token mismatch
    result = json.loads(out.read_text())
    modes = (("single", SINGLE_METRICS, 1), ("concurrent", CONCURRENT_METRICS, 2))
    for mode, metrics, streams in modes:
        part = result[mode]
        assert part["verdict"] == "identical" and part["tokens_identical"] is True
        assert len(part["rounds"]) == 2 and len(part["warmup"]) == 1
        for rec in part["rounds"]:
            assert rec["mlx_lm"]["tokens"] == rec["mlxd"]["tokens"]
            for side in ("mlx_lm", "mlxd"):
                assert rec[side]["generated"] == 6 * streams
        for key, *_ in metrics:
            assert set(part["summary"]["ratio"][key]) >= {"median", "min", "max", "values"}
            for side in ("mlx_lm", "mlxd"):
                assert part["summary"][side][key]["min"] <= part["summary"][side][key]["max"]
    assert result["concurrent"]["engine_paths"] == {"batched": 6}  # really batched, not serial
    # The lone stream on this (main) thread runs its turns here, warm-up included (driver.py).
    assert result["single"]["engine_paths"] == {"driven": 3, "serial": 3}
    assert result["model"]["name"] == "tiny" and result["env"]["mlx"]
    table = capsys.readouterr().out
    assert "mlxd/mlx-lm" in table and "identical on both sides" in table
    assert "mlxd's paths: driven 3, serial 3" in table
    assert re.search(r"pooled steps, mlx-lm / mlxd \(speed ratio\): p10 [\d.]+ / [\d.]+ ms", table)


def test_consistency_tells_a_mismatch_from_a_nondeterministic_backend() -> None:
    def run(a: list[int], b: list[int]) -> dict:
        return {"mlx_lm": {"tokens": a}, "mlxd": {"tokens": b}}

    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == 1
    assert first_divergence([1, 2], [1, 2]) is None
    same = consistency([run([1, 2, 3], [1, 2, 3])] * 3)
    assert same["verdict"] == "identical"
    # mlx-lm repeats itself but mlxd does not: mlxd did other work.
    assert consistency([run([1, 2, 3], [1, 2, 4])] * 3)["verdict"] == "MISMATCH"
    # mlx-lm differs from itself too: no bitwise check is possible on that backend.
    noisy = consistency([run([1, 2, 3], [1, 2, 4]), run([1, 5, 3], [1, 2, 3])])
    assert noisy["verdict"] == "backend-nondeterministic"
    assert noisy["first_divergence"]["mlx_lm"] == [1]


@pytest.mark.parametrize("bad", [["--concurrent", "1"], ["--gen-tokens", "1"]])
def test_bench_generate_refuses_meaningless_settings(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "generate", "--random-shape", "tiny", "--rounds", "1", *bad])
    assert e.value.code not in (0, None)


def test_bench_generate_with_quantized_kv(tmp_path: Path, capsys) -> None:
    """--kv-bits reaches both sides: the tokens are mlx-lm's with the same KV flags."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlxd.bench.models import build_random, random_prompts

    out = tmp_path / "bench.json"
    argv = ["bench", "generate", "--random-shape", "tiny", "--dtype", "float32", "--rounds", "1"]
    argv += ["--prompt-tokens", "12", "--gen-tokens", "6", "--kv-bits", "2", "--warmup", "0"]
    main([*argv, "--kv-group-size", "32", "--json", str(out)])
    result = json.loads(out.read_text())
    got = result["single"]["rounds"][0]
    bm = build_random("tiny", "float32", seed=0)
    prompt = mx.array(random_prompts(bm.vocab_size, 1, 12, 0)[0])
    flags = dict(kv_bits=2, kv_group_size=32, quantized_kv_start=0)
    want = [int(t) for t, _ in generate_step(prompt, bm.model, max_tokens=6, **flags)]
    plain = [int(t) for t, _ in generate_step(prompt, bm.model, max_tokens=6)]
    assert want != plain  # 2-bit KV changes this model's greedy tokens: the flags are seen
    assert got["mlx_lm"]["tokens"] == got["mlxd"]["tokens"] == want
    assert "KV: 2-bit, group 32, from token 0 (both sides)" in capsys.readouterr().out


def test_bench_generate_concurrent_with_quantized_kv(tmp_path: Path) -> None:
    """--kv-bits --concurrent: mlx-lm runs the streams one after another (as mlx_lm.server does
    with --kv-bits) and mlxd batches them; every stream's tokens are generate_step's."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlxd.bench.models import build_random, random_prompts

    out = tmp_path / "bench.json"
    argv = ["bench", "generate", "--random-shape", "tiny", "--dtype", "float32", "--rounds", "1"]
    argv += ["--prompt-tokens", "12", "--gen-tokens", "6", "--kv-bits", "4", "--warmup", "0"]
    argv += ["--kv-group-size", "32", "--quantized-kv-start", "14", "--concurrent", "3"]
    main([*argv, "--json", str(out)])
    result = json.loads(out.read_text())["concurrent"]
    bm = build_random("tiny", "float32", seed=0)
    flags = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=14)
    want = [
        [int(t) for t, _ in generate_step(mx.array(p), bm.model, max_tokens=6, **flags)]
        for p in random_prompts(bm.vocab_size, 3, 12, 1)
    ]
    got = result["rounds"][0]
    assert got["mlx_lm"]["tokens"] == got["mlxd"]["tokens"] == want
    assert result["engine_paths"]["crossed to quantized"] == 3


def test_pooled_steps_pool_every_round_per_side() -> None:
    def run(times: list[float]) -> dict:
        return {"token_times_ms": times}

    # mlx-lm steps: 10, 10 | 20, 20 ; mlxd steps: 5, 15 | 25, 30 (ms)
    rounds = [
        {"mlx_lm": run([0, 10, 20]), "mlxd": run([0, 5, 20])},
        {"mlx_lm": run([100, 120, 140]), "mlxd": run([100, 125, 155])},
    ]
    pooled = pooled_steps(rounds)
    assert pooled["mlx_lm"] == {"p10": 10, "p25": 10, "p50": 10}
    assert pooled["mlxd"] == {"p10": 5, "p25": 5, "p50": 15}


def test_bench_generate_with_an_adapter(tmp_path: Path, tiny_model) -> None:
    """--adapter-path: mlx-lm's side through its LoRA layers, mlxd's through its engine's
    adapter slots; the same tokens, and not the base model's."""
    from fixtures.adapters import tiny_adapter_dir

    folder = tiny_model("qwen3")
    adapter = tiny_adapter_dir(folder, "lora", seed=1)
    argv = ["bench", "generate", "--model", str(folder), "--rounds", "1", "--warmup", "0"]
    argv += ["--prompt-tokens", "12", "--gen-tokens", "6"]
    tokens = {}
    for name, extra in (("base", []), ("adapter", ["--adapter-path", str(adapter)])):
        out = tmp_path / f"{name}.json"
        main([*argv, *extra, "--json", str(out)])
        rec = json.loads(out.read_text())["single"]["rounds"][0]
        assert rec["mlx_lm"]["tokens"] == rec["mlxd"]["tokens"]
        tokens[name] = rec["mlxd"]["tokens"]
    assert tokens["adapter"] != tokens["base"]
