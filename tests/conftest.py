"""Session fixtures shared by the test suite: the real Qwen3 tokenizer and tiny random models.

Both are built once per machine into the fixture cache (``$MLXD_TEST_CACHE`` or
``<repo>/.cache/test-fixtures``); see tests/README.md. Heavy imports stay inside the fixtures
so that test modules which need neither pay nothing for them.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.tiny_models import ARCHS, DEFAULT_SEED


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    """A folder holding the real Qwen3 tokenizer.json and tokenizer_config.json."""
    from fixtures.fetch import qwen3_tokenizer_dir as fetch

    return fetch()


@pytest.fixture(scope="session")
def tiny_model(qwen3_tokenizer_dir: Path) -> Callable[..., Path]:
    """`tiny_model(arch, seed=0)`: the mlx-lm model folder of a tiny random `arch` model."""
    from fixtures.tiny_models import tiny_model_dir

    def get(arch: str, seed: int = DEFAULT_SEED) -> Path:
        return tiny_model_dir(arch, qwen3_tokenizer_dir, seed)

    return get


@pytest.fixture(scope="session", params=ARCHS, ids=ARCHS)
def tiny_model_path(request: pytest.FixtureRequest, tiny_model: Callable[..., Path]) -> Path:
    """Parametrized over every architecture: the folder of its tiny model."""
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def loaded_pair(tiny_model: Callable[..., Path]):
    """`loaded_pair(arch)`: the tiny `arch` model loaded by both mlx_lm.load and mlxd.load
    (tests/parity/helpers.Pair), loaded once per session and shared by the parity tests."""
    from parity.helpers import load_pair

    cache = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = load_pair(arch, tiny_model(arch))
        return cache[arch]

    yield get
    cache.clear()


@pytest.fixture(scope="session")
def tiny_lm(tiny_model: Callable[..., Path]) -> Callable[[str], Any]:
    """`tiny_lm(arch)`: the tiny `arch` model loaded by mlx_lm.load (once per session)."""
    from mlx_lm import load

    loaded: dict[str, Any] = {}

    def get(arch: str) -> Any:
        if arch not in loaded:
            loaded[arch] = load(str(tiny_model(arch)))[0]
        return loaded[arch]

    return get
