"""Issue 7, point 1 over HTTP: mlx_lm.server and mlxd serve with the same `--kv-bits`,
`--kv-group-size` and `--quantized-kv-start` answer the same requests with the same tokens,
logprobs, text and usage (mlx_lm.server runs such rows one at a time; so does mlxd, for now)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LiveServer, start_server
from test_mlx_lm_server_parity import _comparable, _post, run_mlx_lm_server

FLAGS = {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 8}


@pytest.fixture(scope="module")
def theirs(qwen3_model_dir: Path) -> Iterator[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    yield from run_mlx_lm_server(qwen3_model_dir, *flags)


@pytest.fixture(scope="module")
def ours(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(
        model=str(qwen3_model_dir), data_dir=str(tmp_path_factory.mktemp("d")), **FLAGS
    )
    yield live
    live.stop()


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}),
        ("/v1/completions", {"prompt": "The weather today is nice and"}),
    ],
)
def test_quantized_kv_equals_mlx_lm_server(ours, theirs: str, path: str, body: dict) -> None:
    body = {**body, "max_tokens": 24, "logprobs": True}
    want = _post(theirs, path, body)
    assert want["usage"]["prompt_tokens"] + 24 > FLAGS["quantized_kv_start"]  # it does convert
    assert _comparable(_post(ours.url, path, body)) == _comparable(want)
