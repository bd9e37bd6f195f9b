"""The suite's tokenizer and tiny-model fixtures (tests/fixtures/, on the path through pytest's
`pythonpath`), for the probes' tests that serve or load a model folder."""

from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.tiny_models import DEFAULT_SEED


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    from fixtures.fetch import qwen3_tokenizer_dir as fetch

    return fetch()


@pytest.fixture(scope="session")
def tiny_model(qwen3_tokenizer_dir: Path) -> Callable[..., Path]:
    from fixtures.tiny_models import tiny_model_dir

    def get(arch: str, seed: int = DEFAULT_SEED) -> Path:
        return tiny_model_dir(arch, qwen3_tokenizer_dir, seed)

    return get
