"""GGUF → MLX folder conversion (cached under MLXD_HOME, keyed by the file's hash)."""

from .convert import convert_gguf

__all__ = ["convert_gguf"]
