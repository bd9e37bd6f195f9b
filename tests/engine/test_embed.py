"""engine/embed.py on mlx-lm's tiny models: length buckets, every architecture's hidden state,
and a long input's chunked forward."""

import mlx.core as mx
import pytest

from mlxd.engine import embed as embed_mod
from mlxd.engine.embed import buckets, embed


def test_buckets_group_equal_lengths_within_the_token_cap() -> None:
    assert buckets([3, 5, 3, 3, 5], max_tokens=6) == [[0, 2], [3], [1], [4]]
    assert buckets([100], max_tokens=6) == [[0]]  # one input over the cap still runs


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3", "lfm2", "phi3"])
def test_each_vector_is_the_inputs_own_mean_state(tiny_lm, arch: str) -> None:
    model = tiny_lm(arch)
    inputs = [[5, 17, 99, 3], [7, 7, 21, 300], [11, 12]]
    got = embed(model, inputs)
    for ids, vector in zip(inputs, got, strict=True):
        v = model.model(mx.array([ids]))[0].astype(mx.float32).mean(axis=0)
        assert_same(vector, (v / mx.linalg.norm(v)).tolist())


def assert_same(got: list[float], alone: list[float]) -> None:
    """Bit for bit on the CPU; a GPU's batched kernels round otherwise (an H100: up to 2e-4)."""
    if mx.default_device() == mx.cpu:
        assert got == alone
    else:
        assert mx.allclose(mx.array(got), mx.array(alone), atol=5e-4).item()


def test_a_long_input_runs_in_chunks_through_a_cache(tiny_lm, monkeypatch) -> None:
    model = tiny_lm("qwen3")
    ids = list(range(3, 40))
    whole = embed(model, [ids])[0]
    monkeypatch.setattr(embed_mod, "MAX_BATCH_TOKENS", 16)
    monkeypatch.setattr(embed_mod, "PREFILL_STEP", 8)
    caches: list[object] = []
    real = embed_mod.make_prompt_cache
    monkeypatch.setattr(embed_mod, "make_prompt_cache", lambda m: caches.append(1) or real(m))
    chunked = embed(model, [ids])[0]
    assert caches == [1]
    # the same states up to rounding (attention over a cache, as mlx-lm's chunked prefill)
    atol = 1e-5 if mx.default_device() == mx.cpu else 1e-4
    assert mx.allclose(mx.array(chunked), mx.array(whole), atol=atol).item()
    assert chunked != embed(model, [ids[:16]])[0]
