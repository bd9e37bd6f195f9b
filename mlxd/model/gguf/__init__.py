"""GGUF → MLX folder conversion (cached under MLXD_HOME, keyed by the file's hash)."""

from pathlib import Path


def convert_gguf(
    path: Path, out: Path | None = None, dtype: str | None = None, force: bool = False
) -> Path:
    raise NotImplementedError("GGUF conversion is being written")
