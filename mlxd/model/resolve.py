"""Turn a model reference into a local MLX model folder: a folder, a GGUF file, a Hugging Face
repo id (local cache first, `HF_HUB_OFFLINE` respected), or nothing (the embedded default)."""

import os
import re
from pathlib import Path

from ..config import hf_offline
from .errors import ModelLoadError

# The files mlx-lm needs from a repo (its DEFAULT_ALLOW_PATTERNS).
ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


# Hugging Face's repo id rules: "owner/name", letters, digits, "-", "_", "." (no "..").
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def cached_repo(ref: str) -> Path | None:
    """`ref`'s folder when it is a repo id already in the local Hugging Face cache, else None.
    Nothing outside the cache is looked at, so a request's name tells it nothing else."""
    if not _REPO_ID.fullmatch(ref) or ".." in ref:
        return None
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(ref, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except Exception:  # noqa: BLE001 - every hub error means "not in the cache"
        return None
    return path if (path / "config.json").is_file() else None


def _looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or ref.endswith(".gguf") or ref.count("/") != 1


def _from_hf(repo: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                repo, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=True
            )
        )
    except LocalEntryNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - a bad id raises several hub errors; all mean "not here"
        if not isinstance(e, (ValueError, OSError, HfHubHTTPError)):
            raise
    if hf_offline():
        raise ModelLoadError(
            f"model '{repo}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
        )
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS))
    except Exception as e:  # noqa: BLE001 - network, auth and not-found all end the same way
        raise ModelLoadError(
            f"model '{repo}' is neither a local path nor in the local Hugging "
            f"Face cache, and downloading it failed: {type(e).__name__}"
        ) from e


def _magic(path: Path) -> bytes:
    """A file's first four bytes (a GGUF file starts with b"GGUF"), read alone."""
    with path.open("rb") as f:
        return f.read(4)


def resolve_model(ref: str | os.PathLike | None, revision: str | None = None) -> Path:
    """The local folder holding config.json, weights and tokenizer for `ref`."""
    if ref is None:
        from .default import default_model_path

        return default_model_path()
    try:
        path = Path(ref).expanduser()
        kind = "file" if path.is_file() else "dir" if path.is_dir() else None
    except (OSError, RuntimeError, ValueError) as e:  # ~nosuchuser, a name too long, a NUL
        why = type(e).__name__
        raise ModelLoadError(f"{str(ref)[:200]!r}: not a model reference ({why})") from None
    if kind == "file":
        if path.suffix == ".gguf" or _magic(path) == b"GGUF":
            from .gguf import convert_gguf

            return convert_gguf(path)
        raise ModelLoadError(f"{path}: not a model folder or a GGUF file")
    if kind == "dir":
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            from .gguf import convert_gguf

            return convert_gguf(ggufs[0])
        return path
    if _looks_like_path(str(ref)):
        raise ModelLoadError(f"{path}: no such file or directory")
    return _from_hf(str(ref), revision)
