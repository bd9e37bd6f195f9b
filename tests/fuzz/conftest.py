"""One live server (tiny random qwen3, uvicorn in a thread) for the hostile fuzz tests, offline:
a hostile `model` that reads as a Hugging Face repo id is looked up in the local cache only."""

from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
from serve.conftest import LiveServer, qwen3_model_dir, start_server

from mlxd.config import ServeConfig

__all__ = ["qwen3_model_dir"]  # the fixture, for the one below


@pytest.fixture(scope="module")
def fuzz_server(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        data = tmp_path_factory.mktemp("fuzz-data")
        flags = {"model": str(qwen3_model_dir), "data_dir": str(data), "max_tokens": 4}
        if "allow_model_paths" in {f.name for f in fields(ServeConfig)}:
            flags["allow_model_paths"] = True  # mlx_lm.server's surface: any name is looked up
        live = start_server(**flags)
        yield live
        live.stop()
