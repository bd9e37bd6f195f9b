"""`--batched-attention folded` (mlxd/model/folded_attention.py): the batched decode step's
attention as two matmuls with each KV head's query group folded into the rows.

On the CPU, MLX's masked attention is its fallback formula, so folded attention must equal it
bit for bit there; on CUDA the two differ in rounding (docs/performance.md), which is why the
mode is opt-in."""

from pathlib import Path

import mlx.core as mx
import pytest
from fixtures.batch_oracle import batch_generator_outputs
from fixtures.folded_models import PROMPTS, load_model, padded_decode, qwen2_model

from mlxd.config import EngineConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.model import folded_attention as fa

# Folded attention equals MLX's masked attention bit for bit on the CPU only; on CUDA another
# matmul shape rounds otherwise (why the mode is opt-in). bench/h200/cuda_tests.sh runs this file.
cpu_bits = pytest.mark.skipif(mx.cuda.is_available(), reason="CUDA rounds folded otherwise")


@pytest.fixture(params=["llama", "qwen3", "qwen3_moe", "qwen2"])
def model(request, tiny_model):
    return qwen2_model() if request.param == "qwen2" else load_model(tiny_model, request.param)


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """Counts the folded attention calls (so a test sees the folded path ran, not the inner)."""
    seen: list[int] = []
    real = fa.attention

    def spy(*a):
        seen.append(1)
        return real(*a)

    monkeypatch.setattr(fa, "attention", spy)
    return seen


@cpu_bits
def test_shadow_model_equals_the_model_bit_for_bit_and_leaves_it_unchanged(model, calls) -> None:
    shadow = fa.folded(model)
    expected = padded_decode(model, 10, [0, 4, 9])
    assert calls == []  # the caller's model kept its own attention
    got = padded_decode(shadow, 10, [0, 4, 9])
    assert mx.array_equal(got, expected).item()
    assert len(calls) == 10 * len(model.layers)  # every decode step, every layer, folded
    inner = shadow.model.layers[0].self_attn.inner
    assert inner is model.model.layers[0].self_attn  # weights shared, not copied
    assert type(model.model.layers[0].self_attn).__name__ == "Attention"


def _decode_poisoned(model, steps: int, pads: list[int], poison: float | None) -> mx.array:
    """`padded_decode`, with every cache buffer's positions past the written keys set to
    `poison` before each step (what an aligned read takes in beyond the row's keys)."""

    def fill(caches: list) -> None:
        for c in caches:
            past = (mx.arange(c.keys.shape[2]) >= c._idx)[None, None, :, None]
            c.keys = mx.where(past, mx.array(poison, c.keys.dtype), c.keys)
            c.values = mx.where(past, mx.array(poison, c.values.dtype), c.values)

    return padded_decode(model, steps, pads, fill if poison is not None else None)


def test_aligned_keys_are_masked_out_exactly(model, monkeypatch) -> None:
    """On CUDA the keys are padded to a multiple of 8 from the cache buffer (key_alignment).
    The extra positions get weight 0: the output does not depend on what the buffer holds
    there (bit for bit), and it stays the unaligned attention up to rounding."""
    lengths: list[int] = []
    real = fa.attention

    def spy(q, k, v, scale, mask, *rest):
        lengths.append(k.shape[2])
        return real(q, k, v, scale, mask, *rest)

    monkeypatch.setattr(fa, "attention", spy)
    aligned = fa.folded(model, align=8)
    clean = _decode_poisoned(aligned, 6, [0, 4, 9], None)
    assert lengths and all(n % 8 == 0 for n in lengths)  # 12..17 keys read as 16 or 24
    masks = {id(layer.self_attn.masks) for layer in aligned.model.layers}
    assert len(masks) == 1  # one padded mask per step, shared by the layers
    assert 0 < aligned.model.layers[0].self_attn.masks.built <= 6
    poisoned = _decode_poisoned(aligned, 6, [0, 4, 9], 1000.0)
    assert mx.array_equal(clean, poisoned).item()
    if mx.cuda.is_available():
        return  # the unaligned read is another matmul shape there: rounding, then greedy drift
    plain = _decode_poisoned(fa.folded(model, align=1), 6, [0, 4, 9], 1000.0)
    assert mx.allclose(clean, plain, atol=1e-2, rtol=1e-2).item()
    assert mx.array_equal(mx.argmax(clean, -1), mx.argmax(plain, -1)).item()


def test_key_alignment_is_off_on_the_cpu() -> None:
    assert fa.key_alignment() == (8 if mx.cuda.is_available() else 1)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("boolean", [True, False])
def test_formula_equals_mlx_masked_attention_on_cpu(groups: int, boolean: bool) -> None:
    mx.random.seed(11)
    B, kv, L, D = 3, 2, 37, 64
    q = mx.random.normal((B, kv * groups, 1, D)).astype(mx.bfloat16)
    k, v = (mx.random.normal((B, kv, L, D)).astype(mx.bfloat16) for _ in range(2))
    mask = (mx.arange(L)[None] >= mx.array([0, 5, 30])[:, None]).reshape(B, 1, 1, L)
    if not boolean:
        mask = mx.where(mask, 0.0, -1e4).astype(mx.bfloat16)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
    got = fa.attention(q, k, v, D**-0.5, mask)
    assert got.shape == ref.shape
    assert mx.array_equal(got, ref).item()
    unmasked = fa.attention(q, k, v, D**-0.5, mx.ones_like(mask) if boolean else 0 * mask)
    assert not mx.array_equal(unmasked, ref).item()  # the mask is applied


@cpu_bits
def test_engine_with_folded_attention_equals_batch_generator_on_cpu(tiny_model, calls) -> None:
    model = load_model(tiny_model, "qwen3")
    expected = batch_generator_outputs(model, PROMPTS, 12, frozenset())
    engine = Engine(model, config=EngineConfig(8, 8, 2048, attention="folded"))
    try:
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=12) for p in PROMPTS]
        for handle, ref in zip(engine.submit_many(reqs), expected, strict=True):
            got = [(e.token, e.logprobs) for e in handle]
            assert [t for t, _ in got] == [t for t, _ in ref]
            assert all(mx.array_equal(a, b).item() for (_, a), (_, b) in zip(got, ref, strict=True))
    finally:
        engine.close()
    assert calls  # the batched decode went through folded attention


def test_an_architecture_it_does_not_know_is_refused_by_name(tiny_model) -> None:
    model = load_model(tiny_model, "gemma3")
    with pytest.raises(ValueError, match="'gemma3_text'"):
        fa.folded(model)
    with pytest.raises(
        ValueError, match="folded supports llama, mistral, qwen2, qwen3, qwen3_moe;"
    ):
        Engine(model, config=EngineConfig(8, 8, 2048, attention="folded"))


def _serve_args(model: Path, data: Path, *flags: str):
    from mlxd.cli.serve import parse_config

    return parse_config(["--model", str(model), "--data-dir", str(data), *flags])


def test_a_server_with_folded_attention_answers_as_without_it_on_cpu(
    tiny_model, tmp_path, calls
) -> None:
    """`mlxd serve --batched-attention folded`: concurrent requests (batched) get the same text
    as the default server; on the CPU the two attentions are bit-equal."""
    import asyncio

    import httpx

    from mlxd.serve.app import build_app
    from mlxd.serve.main import make_state

    prompts = ["Tell me a story", "The sea is", "One two three four five six seven"]

    def answers(*flags: str) -> list[str]:
        state = make_state(_serve_args(tiny_model("qwen3"), tmp_path / flags[-1], *flags))
        transport = httpx.ASGITransport(app=build_app(state))

        async def post_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                bodies = [{"prompt": p, "max_tokens": 16, "temperature": 0} for p in prompts]
                return await asyncio.gather(
                    *(client.post("/v1/completions", json=b) for b in bodies)
                )

        try:
            responses = asyncio.run(post_all())
            paths = state.provider.default.engine.stats()["paths"]
        finally:
            state.provider.close()
        assert all(r.status_code == 200 for r in responses)
        assert paths.get("batched", 0) >= 2  # the rows shared the batched step
        return [r.json()["choices"][0]["text"] for r in responses]

    folded = answers("--batched-attention", "folded")
    assert (n := len(calls)) > 0  # the server's batched steps went through folded attention
    assert folded == answers("--batched-attention", "mlx")
    assert len(calls) == n  # and the default server's did not


def test_a_server_refuses_folded_attention_for_an_unknown_architecture(
    tiny_model, tmp_path
) -> None:
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    args = _serve_args(tiny_model("gemma3"), tmp_path, "--batched-attention", "folded")
    with pytest.raises(ModelLoadError, match="this model is 'gemma3_text'"):
        make_state(args)
