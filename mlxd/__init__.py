"""mlxd: a local LLM engine and server on MLX, a bit-exact drop-in for mlx-lm.

`from mlxd import load, generate, stream_generate, batch_generate` behaves like the same
import from `mlx_lm`, and `load` also takes GGUF files and `None` (the embedded default model).
`Engine(model, config=EngineConfig(...))` is the server's engine for a program of its own.
"""

# First, before anything imports mlx: an optimized BLAS for MLX's Linux CPU backend (blas.py).
from .blas import blas_in_use, preload

preload()

from .config import EngineConfig  # noqa: E402
from .engine import (  # noqa: E402
    Engine,
    GenerationRequest,
    SamplingParams,
    batch_generate,
    generate,
    stream_generate,
)
from .model import ModelLoadError, load  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "Engine",
    "EngineConfig",
    "GenerationRequest",
    "ModelLoadError",
    "SamplingParams",
    "batch_generate",
    "blas_in_use",
    "generate",
    "load",
    "stream_generate",
]
