"""`mlxd quantize` end to end in its own process: it prints the folder it wrote, mlx_lm.load
loads it, the default folder is under MLXD_HOME/models, and an existing --out is refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mlx_lm import load


def mlxd(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "mlxd", "quantize", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_quantize_writes_a_loadable_model(tmp_path, tiny_model):
    src = tiny_model("qwen3")
    out = tmp_path / "q8"
    done = mlxd(str(src), "--out", str(out), "--bits", "8", "--group-size", "32", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert "100%" in done.stderr  # the progress bar reached the end
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    model, tokenizer = load(str(out))
    assert model.model.layers[0].mlp.down_proj.bits == 8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no job folder left

    again = mlxd(str(src), "--out", str(out), home=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr


def test_default_out_is_under_mlxd_home(tmp_path, tiny_model):
    src = tiny_model("qwen3")
    done = mlxd(str(src), "--mode", "mxfp4", "--name", "tiny-fp4", home=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "models" / "tiny-fp4"
    assert done.stdout.strip() == str(out)
    load(str(out))


def test_bad_flag_is_one_line(tmp_path, tiny_model):
    done = mlxd(str(tiny_model("qwen3")), "--bits", "9", home=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("mlxd quantize: error: bits:")
