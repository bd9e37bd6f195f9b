"""Check a model folder before loading it, so each problem is one line naming the file."""

import json
import struct
from pathlib import Path

from .errors import ModelLoadError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def check_config(folder: Path) -> dict:
    """config.json exists, parses, and names a model_type mlx-lm implements."""
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{cfg_path}: missing (not an MLX / Hugging Face model folder)")
    try:
        config = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: not valid JSON ({e})") from e
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelLoadError(f"{cfg_path}: has no 'model_type'")
    from mlx_lm.utils import _get_classes

    try:
        _get_classes(config)
    except ValueError as e:
        raise ModelLoadError(
            f"{cfg_path}: unsupported model_type '{config['model_type']}' "
            "(not implemented by the installed mlx-lm)"
        ) from e
    return config


def check_safetensors(path: Path) -> None:
    """The header parses and the file is as long as the header says (catches truncation)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n <= 0 or 8 + n > size:
                raise ValueError("header length past end of file")
            header = json.loads(f.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: corrupt safetensors file ({e})") from e
    if 8 + n + max(ends, default=0) > size:
        raise ModelLoadError(
            f"{path}: truncated safetensors file ({size} bytes, header needs {8 + n + max(ends)})"
        )


def check_folder(folder: Path) -> dict:
    """Everything mlx-lm would trip over with a traceback, as a ModelLoadError instead."""
    config = check_config(folder)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files")
    for w in weights:
        check_safetensors(w)
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{folder}: missing tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return config
