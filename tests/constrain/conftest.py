"""Fixtures for the structured-output tests: the tiny random qwen3 model and one compiler for
its tokenizer (built once per session: building the token table takes seconds)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def qwen3_lm(tiny_model: Callable[..., Path]) -> tuple[Any, Any]:
    """(model, TokenizerWrapper) of the tiny random qwen3 model."""
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))


@pytest.fixture(scope="session")
def compiler(qwen3_lm: tuple[Any, Any]) -> Any:
    from mlxd.constrain import compiler_for

    return compiler_for(qwen3_lm[1])
