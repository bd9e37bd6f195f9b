"""Session fixtures shared by the test suite: the real Qwen3 tokenizer and tiny random models.

Both are built once per machine into the fixture cache (``$MLXD_TEST_CACHE`` or
``<repo>/.cache/test-fixtures``); see tests/README.md. Heavy imports stay inside the fixtures
so that test modules which need neither pay nothing for them.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures import model_fixtures
from fixtures.tiny_models import ARCHS
from hypothesis import settings

# Before any test imports mlx: mlxd's BLAS (mlxd/blas.py). The processes tests start
# (mlx_lm.server, `python -m mlx_lm`) preload the same one, so their bits compare with ours.
import mlxd.blas

os.environ.update(mlxd.blas.same_blas(os.environ))
# The suite's servers run their engine in the test's process (the tests reach into it), and so
# do the `mlxd serve` processes it starts; tests/serve/test_engine_process*.py run the child.
os.environ.setdefault("MLXD_ISOLATION", "off")

# The tokenizer and tiny-model fixtures, shared with bench/probes/tests.
qwen3_tokenizer_dir = model_fixtures.qwen3_tokenizer_dir
tiny_model = model_fixtures.tiny_model


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


# Hypothesis profiles. `HYPOTHESIS_PROFILE=deep` runs the hostile fuzz (tests/fuzz) at ~50x its
# CI size with new cases each run; unset, every test keeps its own bounded settings.
settings.register_profile("deep", max_examples=1500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
