"""KV schemes a cache layer cannot take: mlx-lm raises "RotatingKVCache Quantization NYI" in the
middle of generation. The engine (the Python API) keeps exactly that; the server refuses such a
request before any work (400) and refuses to start when every request would fail, naming the
layer. Rows that never reach `quantized_kv_start` run, as in mlx-lm; recurrent layers keep
their own format. Oracle: mlx-lm's generate_step with the same flags, in the same test."""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.kv.schemes import reaches_quantization, unsupported


def _req(tok, n: int, **kw) -> GenerationRequest:
    return GenerationRequest(prompt=mx.array(tok.encode("Tell me a story")), max_tokens=n, **kw)


def _same_as_mlx_lm(model, req: GenerationRequest, engine: Engine) -> None:
    want = list(generate_step(req.prompt, model, max_tokens=req.max_tokens, kv_bits=req.kv_bits,
                              kv_group_size=req.kv_group_size,
                              quantized_kv_start=req.quantized_kv_start))  # fmt: skip
    got = [(e.token, e.logprobs) for e in engine.submit(req)]
    assert [t for t, _ in got] == [int(t) for t, _ in want]
    assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, want, strict=True))


@pytest.fixture
def engine_on(tiny_model: Callable[..., Path]) -> Iterator[Callable[[str], tuple]]:
    """`engine_on(arch)`: (model, tokenizer, engine) on a tiny model, closed after the test."""
    engines: list[Engine] = []

    def make(arch: str) -> tuple:
        model, tok = load(str(tiny_model(arch)))
        engines.append(Engine(model))
        return model, tok, engines[-1]

    yield make
    for engine in engines:
        engine.close()


def test_the_engine_fails_a_rotating_layer_as_mlx_lm_does(engine_on) -> None:
    model, tok, engine = engine_on("gemma3")
    with pytest.raises(NotImplementedError, match="RotatingKVCache Quantization NYI"):
        list(engine.submit(_req(tok, 8, kv_bits=4, quantized_kv_start=0)))
    # A row that never reaches the start runs as in mlx-lm (which never converts it).
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=4, quantized_kv_start=5000), engine)
    _same_as_mlx_lm(model, _req(tok, 8), engine)  # and the engine still serves plain rows


def test_which_rows_reach_quantization() -> None:
    assert not reaches_quantization(10, 8, quantized_kv_start=18)  # 17 positions at most
    assert reaches_quantization(10, 9, quantized_kv_start=18)
    assert reaches_quantization(10, -1, quantized_kv_start=10**9)  # no limit reaches any
    assert not reaches_quantization(2, 8, quantized_kv_start=18, cached=8)
    assert reaches_quantization(2, 8, quantized_kv_start=18, cached=9)


def test_unsupported_names_the_layer_and_where_its_window_comes_from(engine_on) -> None:
    gemma, _, _ = engine_on("gemma3")
    qwen, _, _ = engine_on("qwen3")
    assert "cache layer 0: it is a rotating cache (window 16, from the model's sliding" in (
        unsupported(gemma, 4) or ""
    )
    assert "from --max-kv-size" in (unsupported(qwen, 8, max_kv_size=64) or "")
    assert unsupported(qwen, 8) is None and unsupported(gemma, None) is None


def test_recurrent_layers_keep_their_state_format(engine_on) -> None:
    """lfm2: attention layers quantize, the convolution state layers stay as they are."""
    model, tok, engine = engine_on("lfm2")
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=4, kv_group_size=32, quantized_kv_start=0), engine)


def test_a_server_refuses_at_start_up_when_every_request_would_fail(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    args = _serve_args(tiny_model("gemma3"), tmp_path, "--quantized-kv-start", "0")
    with pytest.raises(ModelLoadError, match="cache layer 0: it is a rotating cache"):
        make_state(args)


def test_a_server_refuses_each_request_that_would_fail_and_serves_on(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    import httpx

    from mlxd.serve.app import build_app
    from mlxd.serve.main import make_state

    state = make_state(_serve_args(tiny_model("gemma3"), tmp_path, "--quantized-kv-start", "64"))
    transport = httpx.ASGITransport(app=build_app(state))  # in-process, no port

    async def post(max_tokens: int) -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"prompt": "Tell me a story", "max_tokens": max_tokens}
            return await client.post("/v1/completions", json=body)

    try:
        refused = asyncio.run(post(100))
        assert refused.status_code == 400
        assert "cache layer 0: it is a rotating cache" in refused.json()["error"]["message"]
        assert asyncio.run(post(8)).status_code == 200  # never reaches 64 positions
    finally:
        state.provider.close()


def _serve_args(model: Path, data: Path, *flags: str):
    from mlxd.cli import build_parser

    argv = ["serve", "--model", str(model), "--data-dir", str(data), "--kv-bits", "4", *flags]
    return build_parser().parse_args(argv)
