"""A GGUF is hashed once: later conversions of the unchanged file (same path, size, mtime_ns,
inode) read no bytes of it; a touched file is hashed again but reuses the folder when its bytes
are the same; changed bytes convert again."""

import os
from pathlib import Path

import pytest
from gguf_writer import random_weights, tiny_config, write_gguf

import mlxd.model.gguf.convert as convert_mod
import mlxd.model.gguf.identity as identity
from mlxd.model.gguf import convert_gguf


class Counts:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hashed: list[Path] = []
        self.converted = 0
        self.headers = 0
        hasher, writer, reader = (
            identity.sha256_file,
            convert_mod.write_model,
            convert_mod.read_gguf,
        )

        def hash_counted(path: Path) -> str:
            self.hashed.append(path)
            return hasher(path)

        def write_counted(*args: object) -> None:
            self.converted += 1
            writer(*args)

        def read_counted(path: Path) -> object:
            self.headers += 1
            return reader(path)

        monkeypatch.setattr(identity, "sha256_file", hash_counted)
        monkeypatch.setattr(convert_mod, "write_model", write_counted)
        monkeypatch.setattr(convert_mod, "read_gguf", read_counted)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _gguf(path: Path, seed: int) -> Path:
    config = tiny_config("qwen3")
    return write_gguf(path, config, random_weights(config, seed=seed))


def test_unchanged_file_is_never_read_again(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gguf(tmp_path / "tiny.gguf", seed=1)
    counts = Counts(monkeypatch)
    first = convert_gguf(path, dtype="float32")
    assert (len(counts.hashed), counts.converted) == (1, 1)
    opened: list[str] = []
    real_open = open

    def no_gguf_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_gguf_open)
    again = convert_gguf(path, dtype="float32")
    monkeypatch.undo()  # restores open before the assertions print
    assert again == first
    assert (len(counts.hashed), counts.converted, counts.headers) == (1, 1, 1)
    assert str(path) not in opened and str(path.resolve()) not in opened


def test_touched_file_is_hashed_again_but_not_converted(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gguf(tmp_path / "tiny.gguf", seed=1)
    counts = Counts(monkeypatch)
    first = convert_gguf(path, dtype="float32")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # `touch`: same bytes
    assert convert_gguf(path, dtype="float32") == first
    assert (len(counts.hashed), counts.converted) == (2, 1)
    assert convert_gguf(path, dtype="float32") == first  # the new stat is recorded
    assert (len(counts.hashed), counts.converted) == (2, 1)


def test_changed_bytes_convert_again(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gguf(tmp_path / "tiny.gguf", seed=1)
    counts = Counts(monkeypatch)
    first = convert_gguf(path, dtype="float32")
    _gguf(tmp_path / "other.gguf", seed=2).replace(path)  # new bytes under the same name
    second = convert_gguf(path, dtype="float32")
    assert second != first
    assert (len(counts.hashed), counts.converted) == (2, 2)


def test_force_trusts_no_record(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _gguf(tmp_path / "tiny.gguf", seed=1)
    counts = Counts(monkeypatch)
    convert_gguf(path, dtype="float32")
    convert_gguf(path, dtype="float32", force=True)
    assert (len(counts.hashed), counts.converted) == (2, 2)


def test_records_of_deleted_files_are_pruned(tmp_path: Path, home: Path) -> None:
    gone = _gguf(tmp_path / "gone.gguf", seed=1)
    convert_gguf(gone, out=tmp_path / "a", dtype="float32")
    gone.unlink()
    kept = _gguf(tmp_path / "kept.gguf", seed=2)
    convert_gguf(kept, out=tmp_path / "b", dtype="float32")
    records = list((home / identity.RECORDS).glob("*.json"))
    assert len(records) == 1 and str(kept.resolve()) in records[0].read_text()
