"""KV schemes and the layers that take them: mlx-lm raises "RotatingKVCache Quantization NYI" in
the middle of generation. The engine (the Python API) keeps exactly that unless a request sets
quantize_windows; the server sets it and serves gemma3 with --kv-bits end to end. Rows that
never reach `quantized_kv_start` run, as in mlx-lm; recurrent layers keep their own format; a
kv_config naming a recurrent layer is refused at start-up, naming it. Oracle: mlx-lm's
generate_step with the same flags, in the same test."""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest


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


def test_recurrent_layers_keep_their_state_format(engine_on) -> None:
    """lfm2: attention layers quantize, the convolution state layers stay as they are."""
    model, tok, engine = engine_on("lfm2")
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=4, kv_group_size=32, quantized_kv_start=0), engine)


def test_a_server_quantizes_sliding_window_layers_end_to_end(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """Where mlx_lm.server fails mid-request, mlxd serve converts gemma3's sliding-window
    layers into quantized rings (bits: tests/kv/test_rotating_quantized.py, against mlx-optiq)
    and answers what the engine answers with quantize_windows, concurrent requests batched."""
    import httpx

    from mlxd.serve.app import build_app
    from mlxd.serve.main import make_state

    path = tiny_model("gemma3")
    state = make_state(_serve_args(path, tmp_path, "--quantized-kv-start", "0"))
    transport = httpx.ASGITransport(app=build_app(state))  # in-process, no port
    prompts = ["Tell me a story", "The sea is", "One two three four five six seven"]

    async def post_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0} for p in prompts]
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

    try:
        responses = asyncio.run(post_all())
    finally:
        state.provider.close()
    model, tok = load(str(path))
    engine = Engine(model, tokenizer=tok)  # text deltas, as the server streams them
    try:
        for prompt, r in zip(prompts, responses, strict=True):
            assert r.status_code == 200, r.text
            req = GenerationRequest(prompt=mx.array(tok.encode(prompt)), max_tokens=24, kv_bits=4,
                                    quantized_kv_start=0, quantize_windows=True)  # fmt: skip
            handle = engine.submit(req)
            want = "".join(e.text for e in handle) + handle.wait().text
            assert r.json()["choices"][0]["text"] == want
    finally:
        engine.close()


def test_a_server_refuses_a_kv_config_naming_a_recurrent_layer(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    config = tmp_path / "kv_config.json"
    config.write_text('[{"layer_idx": 0, "bits": 4}]')  # lfm2's layer 0: convolution state
    args = _serve_args(tiny_model("lfm2"), tmp_path, "--kv-config", str(config), kv_bits=False)
    with pytest.raises(ModelLoadError, match="kv_config layer 0 .4-bit. cannot apply: the layer"):
        make_state(args)


def _serve_args(model: Path, data: Path, *flags: str, kv_bits: bool = True):
    from mlxd.cli.serve import parse_config

    argv = ["--model", str(model), "--data-dir", str(data), *flags]
    return parse_config(argv + (["--kv-bits", "4"] if kv_bits else []))
