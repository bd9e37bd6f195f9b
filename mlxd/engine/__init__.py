"""Layer 3: the engine (admission, serial and batched rows, per-row sampling)."""

from .admission import KVBudgetExceeded, Overloaded
from .api import batch_generate, generate, stream_generate
from .engine import Engine
from .request import DoneEvent, GenerationRequest, TokenEvent
from .sampling import SamplingParams

__all__ = [
    "DoneEvent",
    "Engine",
    "GenerationRequest",
    "KVBudgetExceeded",
    "Overloaded",
    "SamplingParams",
    "TokenEvent",
    "batch_generate",
    "generate",
    "stream_generate",
]
