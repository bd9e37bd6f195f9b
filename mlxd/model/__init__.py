"""Layer 1: resolve a model reference, load folders / HF cache / GGUF, the default model."""

from .errors import ModelLoadError
from .load import load
from .resolve import resolve_model

__all__ = ["ModelLoadError", "load", "resolve_model"]
