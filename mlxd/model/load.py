"""`load`: mlx-lm's signature and result, for every reference `resolve_model` understands."""

import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load as _mlx_lm_load
from tqdm import tqdm

from .check import check_folder
from .errors import ModelLoadError
from .peft import mlx_adapter
from .resolve import resolve_model
from .vision.load import is_vision_folder, load_vision


def load(
    path_or_hf_repo: str | Path | None = None,
    tokenizer_config: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    adapter_path: str | None = None,
    lazy: bool = False,
    return_config: bool = False,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[nn.Module, TokenizerWrapper] | tuple[nn.Module, TokenizerWrapper, dict[str, Any]]:
    """Load model and tokenizer; `None` means the embedded default model."""
    folder = resolve_model(path_or_hf_repo, revision=revision)
    if is_vision_folder(folder):  # (VisionModel, mlx-vlm's processor): mlxd.model.vision
        return load_vision(folder)
    check_folder(folder)
    if adapter_path is not None:
        if not _exists(adapter_path):
            raise ModelLoadError(f"{adapter_path[:200]}: adapter path not found")
        adapter_path = mlx_adapter(adapter_path, folder)  # checked; PEFT's converted once
    try:
        loaded = _mlx_lm_load(
            str(folder),
            tokenizer_config=tokenizer_config,
            model_config=model_config,
            adapter_path=adapter_path,
            lazy=True,  # evaluated below, with a progress bar
            return_config=return_config,
            trust_remote_code=trust_remote_code,
        )
        if not lazy:
            _materialize_with_progress(loaded[0], folder.name)
        return loaded
    except (ValueError, OSError, RuntimeError) as e:
        lines = " ".join(line.strip() for line in str(e).splitlines())  # mlx-lm's adapter check
        raise ModelLoadError(f"{folder}: {lines}") from e


def _materialize_with_progress(model: nn.Module, label: str, chunk: int = 256 << 20) -> None:
    """Read the weights in ~256 MB groups so a large model shows progress (tqdm hides itself
    when stderr is not a terminal; small models finish before it would draw)."""
    arrays = [a for _, a in tree_flatten(model.parameters())]
    total = sum(a.nbytes for a in arrays)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {label}",
              file=sys.stderr, disable=None, delay=1.0) as bar:  # fmt: skip
        group, size = [], 0
        for a in arrays:
            group.append(a)
            size += a.nbytes
            if size >= chunk:
                mx.eval(group)
                bar.update(size)
                group, size = [], 0
        mx.eval(group)
        bar.update(size)


def _exists(path: str) -> bool:
    """False for a path the OS cannot even look up (a name too long, a NUL byte)."""
    try:
        return Path(path).exists()
    except (OSError, RuntimeError, ValueError):
        return False
