"""mlxd: a local LLM engine and server on MLX, a bit-exact drop-in for mlx-lm.

`from mlxd import load, generate, stream_generate, batch_generate` behaves like the same
import from `mlx_lm`, and `load` also takes GGUF files and `None` (the embedded default model).
`Engine(model, config=EngineConfig(...))` is the server's engine for a program of its own.
"""

from .config import EngineConfig
from .engine import (
    Engine,
    GenerationRequest,
    SamplingParams,
    batch_generate,
    generate,
    stream_generate,
)
from .model import ModelLoadError, load

__version__ = "0.1.0"
__all__ = [
    "Engine",
    "EngineConfig",
    "GenerationRequest",
    "ModelLoadError",
    "SamplingParams",
    "batch_generate",
    "generate",
    "load",
    "stream_generate",
]
