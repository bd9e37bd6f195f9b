"""`python -m bench.probes.random_model`: the folder the HTTP benchmarks serve holds the bench's
own random model (same weights bit for bit) and loads through mlx-lm like any model."""

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load

from bench.probes.random_model import main
from mlxd.bench.models import build_random


def test_the_folder_loads_as_the_bench_model(qwen3_tokenizer_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    main([str(out), "--shape", "qwen3-host", "--tokenizer", str(qwen3_tokenizer_dir),
          "--dtype", "float32", "--seed", "3"])  # fmt: skip
    model, tokenizer = load(str(out))
    want = dict(tree_flatten(build_random("qwen3-host", "float32", seed=3).model.parameters()))
    got = dict(tree_flatten(model.parameters()))
    assert sorted(got) == sorted(want)
    assert all(mx.array_equal(got[k], want[k]).item() for k in want)
    assert model.args.num_hidden_layers == 28
    assert tokenizer.encode("hello world") == [14990, 1879]  # the Qwen3 tokenizer
