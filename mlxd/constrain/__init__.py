"""Structured outputs: constrain a row's tokens to a JSON Schema, regex, choice or grammar.

llguidance does the grammar work (docs/structured-outputs.md says why, with numbers). The
layer is engine-agnostic: `spec` turns wire formats into a `Constraint`; `compiler` compiles
it for a tokenizer (cached); a `Matcher` tracks one row; `BatchMasker` fills a batch's masks
off the engine thread and applies them to the logits; `GrammarLogitsProcessor` is the same
for mlx-lm's logits-processor hook at B=1.
"""

from .batch import BatchMasker
from .compiler import CompiledGrammar, GrammarCompiler, compiler_for
from .mask import allocate, apply_bitmask
from .matcher import Matcher
from .processor import GrammarLogitsProcessor, make_processor
from .spec import (
    Constraint,
    ConstraintError,
    from_response_format,
    from_structured_outputs,
    from_tool_choice,
)

__all__ = [
    "BatchMasker",
    "CompiledGrammar",
    "Constraint",
    "ConstraintError",
    "GrammarCompiler",
    "GrammarLogitsProcessor",
    "Matcher",
    "allocate",
    "apply_bitmask",
    "compiler_for",
    "from_response_format",
    "from_structured_outputs",
    "from_tool_choice",
    "make_processor",
]
