"""KV accounting per scheme: bytes per token of context, unquantized and quantized, equal what
mlx-lm's own caches hold; the KV budget admits a context with 4-bit KV that it refuses with
unquantized KV; /metrics reports bytes per token per scheme."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlxd.engine.admission import KVBudgetExceeded
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest

N = 256  # one allocation step of mlx-lm's caches: no slack in the measured bytes


def _measured(model, bits: int | None, group: int) -> float:
    """Bytes per token of mlx-lm's caches after N tokens (quantized as generate_step does)."""
    cache = make_prompt_cache(model)
    model(mx.arange(N)[None], cache=cache)
    if bits is not None:
        cache = [c.to_quantized(group_size=group, bits=bits) for c in cache]
    mx.eval([c.state for c in cache])
    return sum(c.nbytes for c in cache) / N


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_bytes_per_token_equal_mlx_lm_s_caches(tiny_model: Callable[..., Path], arch: str) -> None:
    model, _ = load(str(tiny_model(arch)))
    engine = Engine(model)
    try:
        for bits, group in [(4, 64), (8, 32)]:
            engine.announce_scheme(bits, group)
        got = engine.stats()["kv_bytes_per_token"]
        assert got["unquantized"] == _measured(model, None, 64)
        assert got["4bit-g64"] == _measured(model, 4, 64)
        assert got["8bit-g32"] == _measured(model, 8, 32)
        assert got["4bit-g64"] < got["8bit-g32"] < got["unquantized"]
    finally:
        engine.close()


def test_a_budget_admits_with_4_bit_kv_a_context_it_refuses_unquantized(
    tiny_model: Callable[..., Path],
) -> None:
    model, tok = load(str(tiny_model("qwen3")))
    prompt = mx.array(tok.encode("Tell me a story about a cat"))
    per_token = _measured(model, None, 64)
    # 0.6 of what 2N tokens take unquantized. The row holds bf16 until it converts (mlx-lm
    # allocates 256 positions at a time: half of it), then 4-bit: it fits.
    budget = int(per_token * 2 * N * 0.6)
    engine = Engine(model, kv_budget=budget)
    try:
        room = 2 * N - len(prompt)
        with pytest.raises(KVBudgetExceeded, match="kv_budget"):
            engine.submit(GenerationRequest(prompt=prompt, max_tokens=room))
        req = GenerationRequest(prompt=prompt, max_tokens=room, kv_bits=4, quantized_kv_start=0)
        handle = engine.submit(req)
        got = [e.token for e in handle]
        assert len(got) == room and handle.wait().reason == "length"  # admitted, ran out
        # mlx-lm's tokens (the head: 4-bit KV parity in full is tests/engine/test_kv_batching's)
        want = generate_step(prompt, model, max_tokens=48, kv_bits=4, quantized_kv_start=0)
        assert got[:48] == [int(t) for t, _ in want]
    finally:
        engine.close()


def test_admission_runs_more_4_bit_rows_at_once_than_unquantized(
    tiny_model: Callable[..., Path],
) -> None:
    """One admission round under one budget: rows quantized from the prompt fit as many more at
    once as the measured bytes per token say (this fp32 model: 32 bits an element against 4 +
    2 x 32 / 64); rows quantized from token 1024 on cost their unquantized start."""
    from mlxd.config import EngineConfig
    from mlxd.engine.admission import Admission
    from mlxd.engine.request import RequestHandle

    model, _ = load(str(tiny_model("qwen3")))
    total = 8 * N  # tokens of context per row
    budget = int(_measured(model, None, 64) * 4 * total)  # 4 unquantized rows

    def admitted(**kv) -> int:
        adm = Admission(64, 64, budget, model, EngineConfig(64, 8, 2048))
        rows = [
            GenerationRequest(prompt=mx.arange(16), max_tokens=total - 16, **kv) for _ in range(40)
        ]
        adm.push([(r, RequestHandle()) for r in rows])
        return len(adm.take(lambda: [], False))

    ratio = _measured(model, None, 64) / _measured(model, 4, 64)
    assert ratio == 6.4
    assert admitted() == 4
    assert admitted(kv_bits=4, quantized_kv_start=0) == int(4 * ratio)  # 25
    # bf16 up to token 1024 (half of an unquantized row), then 4-bit: twice as many rows
    assert admitted(kv_bits=4, quantized_kv_start=4 * N) == 8
