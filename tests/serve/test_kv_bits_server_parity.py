"""Quantized KV over HTTP: mlx_lm.server and mlxd serve with the same `--kv-bits`,
`--kv-group-size` and `--quantized-kv-start` answer the same requests with the same tokens,
logprobs, text and usage. mlx_lm.server runs such rows one at a time; mlxd batches them."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve.conftest import LiveServer, start_server
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


def test_concurrent_quantized_requests_batch_with_mlx_lm_server_s_bits(
    ours, theirs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlx_lm.server runs --kv-bits requests one at a time; mlxd runs them in one batch (they
    convert at different steps and move into a quantized batch), each with the same answer."""
    from concurrent.futures import ThreadPoolExecutor

    from mlxd.kv.batch_quantized import BatchQuantizedKVCache

    widest, update = [0], BatchQuantizedKVCache.update_and_fetch

    def spy(self, keys, values):  # the most rows one quantized attention call held
        widest[0] = max(widest[0], keys.shape[0])
        return update(self, keys, values)

    monkeypatch.setattr(BatchQuantizedKVCache, "update_and_fetch", spy)
    prompts = ["Once upon a time", "The capital of France is a city that", "Count: one two"]
    bodies = [{"prompt": p, "max_tokens": 20, "logprobs": True} for p in prompts]
    want = [_comparable(_post(theirs, "/v1/completions", b)) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        got = list(pool.map(lambda b: _comparable(_post(ours.url, "/v1/completions", b)), bodies))
    assert got == want
    assert widest[0] >= 2  # quantized rows shared a step
