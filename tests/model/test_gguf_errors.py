"""Every bad GGUF is one ModelLoadError naming the file and the reason, never a traceback."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf_writer import random_weights, tiny_config, write_gguf

from mlxd.model.errors import ModelLoadError
from mlxd.model.gguf import convert_gguf


def _convert_error(path: Path, **kwargs) -> str:
    with pytest.raises(ModelLoadError) as info:
        convert_gguf(path, out=path.parent / "out", **kwargs)
    message = str(info.value)
    assert path.name in message and "\n" not in message
    assert not (path.parent / "out").exists()
    return message


def _tiny(tmp_path: Path, **kwargs) -> Path:
    config = tiny_config("llama")
    return write_gguf(tmp_path / "tiny.gguf", config, random_weights(config), **kwargs)


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a GGUF" * 10)
    assert "not a GGUF file (bad magic" in _convert_error(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "not a GGUF file" in _convert_error(path)


def test_missing_file(tmp_path: Path) -> None:
    assert "not found" in _convert_error(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.001], ids=["half", "in-header"])
def test_truncated_tiny(tmp_path: Path, keep: float) -> None:
    path = _tiny(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert "truncated or corrupt GGUF" in _convert_error(path)


@pytest.mark.slow
def test_truncated_real_gguf(smollm2_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / smollm2_gguf.name
    with open(smollm2_gguf, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(smollm2_gguf.stat().st_size // 2))
    message = _convert_error(path)
    assert "truncated or corrupt GGUF" in message and "runs past the end" in message


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ssm.gguf", tiny_config("llama"), {}, arch="mamba")
    message = _convert_error(path)
    assert "unsupported GGUF architecture 'mamba'" in message
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        assert arch in message


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    # Q8_1 is ggml's activation format: no model stores weights in it, gguf-py cannot read it.
    config = tiny_config("llama")
    rows, cols = config["intermediate_size"], config["hidden_size"]
    block, size = GGML_QUANT_SIZES[Q.Q8_1]
    blocks = np.zeros((rows, cols // block * size), dtype=np.uint8)
    path = _tiny(tmp_path, raw={"model.layers.1.mlp.gate_proj.weight": (blocks, Q.Q8_1)})
    message = _convert_error(path)
    assert "'blk.1.ffn_gate.weight'" in message and "Q8_1" in message


def test_unsupported_dtype(tmp_path: Path) -> None:
    assert "unsupported dtype 'int8'" in _convert_error(_tiny(tmp_path), dtype="int8")


def test_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    path = _tiny(tmp_path)
    precious = tmp_path / "out"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(ModelLoadError, match="not an mlxd conversion"):
        convert_gguf(path, out=precious)
    assert (precious / "notes.txt").read_text() == "mine"
    shutil.rmtree(precious)
