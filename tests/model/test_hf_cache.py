"""A Hugging Face repo id resolves from the local cache, offline; HF_HUB_OFFLINE is respected."""

from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest

from mlxd.model import ModelLoadError, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_cache(root: Path, repo: str) -> Path:
    """The on-disk layout huggingface_hub writes: refs/main → snapshots/<commit>/files."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (snap / name).write_text("{}")
    return snap


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_repo_id_resolves_from_local_cache(hf_cache: Path) -> None:
    snap = _fake_cache(hf_cache, "acme/tiny-model")
    assert resolve_model("acme/tiny-model").resolve() == snap.resolve()


def test_missing_repo_offline_is_a_clear_error(hf_cache: Path) -> None:
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache") as e:
        resolve_model("acme/absent-model")
    assert "acme/absent-model" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)
