"""`mlxd bench serve --adapters` on the tiny qwen3 model with two tiny random adapters: agent i
on adapter i % 2 (mlxd's `lora{i}`), beside side mlxd-base (the same agents, no adapter). Nothing
here asserts a speed."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.adapters import tiny_adapter_dir

from mlxd.bench.lora import agent_fields, lora_flags
from mlxd.bench.random_adapters import make_adapters
from mlxd.bench.variants import ratio_pairs, run_sides, server_flags
from mlxd.cli import main

MAX_TOKENS = 6


def test_agents_spread_over_adapters_beside_the_base(
    tmp_path: Path, tiny_model: Callable[..., Path]
) -> None:
    model = tiny_model("qwen3")
    paths = [tiny_adapter_dir(model, "lora", seed=s) for s in (1, 2)]
    out, md = tmp_path / "lora.json", tmp_path / "lora.md"
    argv = ["bench", "serve", "--model", str(model), "--agents", "2", "--turns", "1"]
    argv += ["--max-tokens", str(MAX_TOKENS), "--system-tokens", "64", "--only", "mlxd"]
    argv += ["--adapters", ",".join(map(str, paths))]
    main([*argv, "--json", str(out), "--markdown", str(md), "--log-dir", str(tmp_path / "logs")])
    result = json.loads(out.read_text())
    assert list(result["sides"]) == ["mlxd", "mlxd-base"]
    lora_cmd = result["sides"]["mlxd"]["command"]
    at = lora_cmd.index("--lora-modules")
    assert lora_cmd[at + 1 : at + 3] == [f"lora0={paths[0]}", f"lora1={paths[1]}"]
    assert "--lora-modules" not in result["sides"]["mlxd-base"]["command"]
    replies = {}
    for side, data in result["sides"].items():
        (run,) = data["runs"]["2"]
        assert run["figures"]["errors"] == 0 and run["figures"]["output_tokens"] == 2 * MAX_TOKENS
        replies[side] = {q["agent"]: q for q in run["requests"]}
    # The server's own account: agent i's stream answered as adapter lora{i}.
    assert [replies["mlxd"][i]["model"] for i in (0, 1)] == ["lora0", "lora1"]
    assert all(replies["mlxd-base"][i]["model"] not in ("lora0", "lora1") for i in (0, 1))
    # Each adapter moved its agent's greedy reply off the base model's.
    for i in (0, 1):
        assert replies["mlxd"][i]["reply_sha1"] != replies["mlxd-base"][i]["reply_sha1"]
    assert result["summary"]["2"]["ratios"]["mlxd/mlxd-base"]["output_tok_s"] > 0
    table = md.read_text()
    assert "| 2 | mlxd/mlxd-base |" in table and f"lora1={paths[1]}" in table
    assert f"--adapters {paths[0]},{paths[1]}" in result["command"]


def test_each_side_gets_its_adapter_fields_and_flags(tmp_path: Path) -> None:
    class Args:
        adapters = ["/a/x", "/a/y"]
        mlxd_args, mlx_lm_args, mlxd_variant, only = "--batch-wait 2", "", [("spec", "-s")], None

    args, model = Args(), tmp_path / "m"
    assert run_sides(args) == ["mlx_lm", "mlxd", "mlxd-base", "mlxd-spec"]
    assert agent_fields(args, "mlxd", model, 3) == [
        {"model": "lora0"},
        {"model": "lora1"},
        {"model": "lora0"},
    ]
    # mlx_lm.server: "default_model" would override `adapters`, so the path goes with it.
    assert agent_fields(args, "mlx_lm", model, 2) == [
        {"model": str(model), "adapters": "/a/x"},
        {"model": str(model), "adapters": "/a/y"},
    ]
    assert agent_fields(args, "mlxd-base", model, 2) == [{}, {}]
    assert agent_fields(args, "mlxd-spec", model, 1) == [{"model": "lora0"}]
    served = ["--lora-modules", "lora0=/a/x", "lora1=/a/y"]
    assert server_flags(args, "mlxd-spec") == [*served, "--batch-wait", "2", "-s"]
    assert server_flags(args, "mlxd-base") == ["--batch-wait", "2"]
    assert server_flags(args, "mlx_lm") == []
    args.adapters = [f"/a/{i}" for i in range(9)]  # past mlxd's default of 8 resident
    assert lora_flags(args, "mlxd")[-2:] == ["--max-loras", "9"]
    sides = ["mlx_lm", "mlxd", "mlxd-base", "mlxd-spec"]
    assert ratio_pairs(sides) == [
        ("mlxd", "mlx_lm"),
        ("mlxd", "mlxd-base"),
        ("mlxd-spec", "mlx_lm"),
        ("mlxd-spec", "mlxd"),
    ]


def test_made_adapters_load_in_mlx_lm_and_change_the_logits(
    tmp_path: Path, tiny_model: Callable[..., Path]
) -> None:
    import mlx.core as mx
    from mlx_lm.utils import load

    model_dir = tiny_model("qwen3")
    paths = make_adapters(model_dir, 2, tmp_path, num_layers=-1)
    config = json.loads((Path(paths[0]) / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == -1
    assert "self_attn.q_proj" in config["lora_parameters"]["keys"]
    tokens = mx.array([[1, 2, 3, 4]])
    base, _ = load(str(model_dir))
    logits = [base(tokens)]
    for p in paths:
        with_adapter, _ = load(str(model_dir), adapter_path=p)
        logits.append(with_adapter(tokens))
    assert not mx.array_equal(logits[0], logits[1])
    assert not mx.array_equal(logits[1], logits[2])  # each adapter its own values


@pytest.mark.parametrize(
    "extra",
    [["--make-adapters", "0"], ["--mlxd-variant", "base=--batch-wait 1", "--make-adapters", "2"]],
)
def test_bench_serve_refuses_bad_adapter_flags(extra: list[str]) -> None:
    with pytest.raises(SystemExit, match="adapters"):
        main(["bench", "serve", "--agents", "1", *extra])
