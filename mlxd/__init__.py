"""mlxd: a local LLM engine and server on MLX, a bit-exact drop-in for mlx-lm.

`from mlxd import load, generate, stream_generate, batch_generate` behaves like the same
import from `mlx_lm`, and `load` also takes GGUF files and `None` (the embedded default model).
`Engine(model, config=EngineConfig(...))` is the server's engine for a program of its own.
"""

from typing import Any

# First, before anything imports mlx: an optimized BLAS for MLX's Linux CPU backend (blas.py).
from .blas import blas_in_use, preload

preload()

from .config import EngineConfig  # noqa: E402
from .engine import (  # noqa: E402
    Engine,
    GenerationRequest,
    SamplingParams,
    batch_generate,
)
from .engine import generate as _generate  # noqa: E402
from .engine import stream_generate as _stream_generate  # noqa: E402
from .model import ModelLoadError, load  # noqa: E402
from .model.vision.api import stream_vision  # noqa: E402
from .model.vision.model import VisionModel  # noqa: E402


def stream_generate(
    model: Any, tokenizer: Any, prompt: Any, *args: Any, image: Any = None, **kwargs: Any
) -> Any:
    """mlx-lm's stream_generate; on a vision model (`load` of a VLM folder), mlx-vlm's, with
    `image=` (paths, arrays or PIL images) and its sampling arguments."""
    if isinstance(model, VisionModel):
        return stream_vision(_stream_generate, model, tokenizer, prompt, image, *args, **kwargs)
    return _stream_generate(model, tokenizer, prompt, *args, **kwargs)


def generate(
    model: Any, tokenizer: Any, prompt: Any, *args: Any, image: Any = None, **kwargs: Any
) -> Any:
    """mlx-lm's generate; on a vision model, the text of `stream_generate` with `image=`."""
    if isinstance(model, VisionModel):
        kwargs.pop("verbose", None)
        stream = stream_vision(_stream_generate, model, tokenizer, prompt, image, *args, **kwargs)
        return "".join(r.text for r in stream)
    return _generate(model, tokenizer, prompt, *args, **kwargs)


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
