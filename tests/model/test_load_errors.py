"""Every bad model reference is one ModelLoadError naming the file, never a traceback."""

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mlxd.model import ModelLoadError, load, resolve_model


def _write_folder(folder: Path, model_type: str = "llama") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": model_type,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": 32,
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), {"x": mx.zeros((64, 64))})
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file or directory") as e:
        resolve_model(str(tmp_path / "nope"))
    assert "nope" in str(e.value)


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelLoadError, match=r"config\.json: missing"):
        load(str(tmp_path / "m"))


def test_unsupported_model_type_is_named(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m", model_type="not_a_real_arch")
    with pytest.raises(ModelLoadError, match="unsupported model_type 'not_a_real_arch'"):
        load(str(folder))


def test_bad_json_config(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load(str(folder))


def test_truncated_safetensors_names_the_file(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors: truncated safetensors"):
        load(str(folder))


def test_corrupt_safetensors_header(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:16] = b"\xff" * 8  # garbage where the JSON header starts
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt safetensors"):
        load(str(folder))


def test_no_weights(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load(str(folder))


def test_missing_tokenizer(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="missing tokenizer"):
        load(str(folder))


def test_plain_file_is_not_a_model(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a model folder or a GGUF file"):
        resolve_model(str(f))


def test_missing_adapter_path(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="adapter path not found"):
        load(str(folder), adapter_path=str(tmp_path / "no-adapter"))


def test_a_large_file_is_judged_by_its_first_bytes(tmp_path: Path, monkeypatch) -> None:
    """Deciding whether a file is a GGUF reads its four magic bytes, never the whole file."""
    f = tmp_path / "big.bin"
    with f.open("wb") as out:
        out.truncate(64 << 20)  # sparse: 64 MB of zeros

    def whole(self: Path) -> bytes:
        raise AssertionError(f"read the whole of {self}")

    monkeypatch.setattr(Path, "read_bytes", whole)
    with pytest.raises(ModelLoadError, match="not a model folder or a GGUF file"):
        resolve_model(str(f))


@pytest.mark.parametrize(
    "ref", ["~nosuchuser", "a" * 300, "bad\0name"], ids=["tilde", "long", "nul"]
)
def test_a_reference_the_os_cannot_look_up_is_a_load_error(ref: str) -> None:
    with pytest.raises(ModelLoadError, match="not a model reference|no such file"):
        resolve_model(ref)
