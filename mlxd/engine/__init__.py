"""Layer 3: the engine (rows, scheduling, sampling). Today: the generation API it will serve."""

from .api import batch_generate, generate, stream_generate

__all__ = ["batch_generate", "generate", "stream_generate"]
