"""`load`: mlx-lm's signature and result, for every reference `resolve_model` understands."""

from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load as _mlx_lm_load

from .check import check_folder
from .errors import ModelLoadError
from .resolve import resolve_model


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
    check_folder(folder)
    if adapter_path is not None and not Path(adapter_path).exists():
        raise ModelLoadError(f"{adapter_path}: adapter path not found")
    try:
        return _mlx_lm_load(
            str(folder),
            tokenizer_config=tokenizer_config,
            model_config=model_config,
            adapter_path=adapter_path,
            lazy=lazy,
            return_config=return_config,
            trust_remote_code=trust_remote_code,
        )
    except (ValueError, OSError, RuntimeError) as e:
        raise ModelLoadError(f"{folder}: {e}") from e
