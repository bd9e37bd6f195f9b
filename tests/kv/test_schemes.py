"""A KV scheme a model's cache layers cannot take is refused before any work, naming the layer
(mlx-lm raises "RotatingKVCache Quantization NYI" in the middle of generation). Rows that can
never reach `quantized_kv_start` still run, as in mlx-lm; recurrent layers keep their own state
format, as in mlx-lm. Oracle: mlx-lm's generate_step with the same flags, in the same test."""

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


def test_a_rotating_layer_refuses_kv_bits_at_submit(engine_on) -> None:
    model, tok, engine = engine_on("gemma3")
    with pytest.raises(ValueError, match=r"cache layer 0: it is a rotating cache \(window"):
        engine.submit(_req(tok, 8, kv_bits=4, quantized_kv_start=0))
    with pytest.raises(ValueError, match="rotating"):  # unlimited tokens reach any start
        engine.submit(_req(tok, -1, kv_bits=4, quantized_kv_start=5000))
    # A row that can never reach the start runs as in mlx-lm (which never converts it).
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=4, quantized_kv_start=5000), engine)
    _same_as_mlx_lm(model, _req(tok, 8), engine)  # and the engine still serves plain rows


def test_max_kv_size_makes_every_layer_rotating(engine_on) -> None:
    model, tok, engine = engine_on("qwen3")
    with pytest.raises(ValueError, match="from --max-kv-size"):
        engine.submit(_req(tok, 8, kv_bits=8, quantized_kv_start=0, max_kv_size=64))
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=8, quantized_kv_start=0), engine)


def test_recurrent_layers_keep_their_state_format(engine_on) -> None:
    """lfm2: attention layers quantize, the convolution state layers stay as they are."""
    model, tok, engine = engine_on("lfm2")
    _same_as_mlx_lm(model, _req(tok, 8, kv_bits=4, kv_group_size=32, quantized_kv_start=0), engine)


def test_a_server_refuses_at_start_up_when_every_request_would_fail(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    from mlxd.cli import build_parser
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    flags = ["--kv-bits", "4", "--quantized-kv-start", "0", "--data-dir", str(tmp_path)]
    args = build_parser().parse_args(["serve", "--model", str(tiny_model("gemma3")), *flags])
    with pytest.raises(ModelLoadError, match="cache layer 0: it is a rotating cache"):
        make_state(args)
