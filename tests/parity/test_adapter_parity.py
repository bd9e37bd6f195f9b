"""Adapters: `adapter_path` gives mlx-lm's tokens and logprobs, bit for bit.

Each tiny architecture gets a LoRA, a DoRA and a full fine-tune adapter made by mlx-lm's own
tuner code (tests/fixtures/adapters.py). The same folder is loaded by `mlx_lm.load` and by
`mlxd.load`; the generations must be identical, and differ from the base model's (an adapter
that changed nothing would prove nothing). `mlxd generate --adapter-path` and `mlxd serve
--adapter-path` are checked against mlx-lm on one of them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import mlx_lm
import numpy as np
import pytest
from fixtures.adapters import FINE_TUNE_TYPES, tiny_adapter_dir
from mlx_lm.sample_utils import make_sampler
from parity.helpers import (
    PROMPT_TEXT,
    Pair,
    assert_same_batch,
    assert_same_parameters,
    assert_same_run,
    run_batch,
    run_stream,
)

import mlxd

ARCHS = ("llama", "qwen3", "gemma3")
TOKENS = 8
SAMPLER = dict(temp=0.8, top_k=40)
SEED = 5


@pytest.fixture(scope="module")
def adapted(tiny_model: Callable[..., Path]) -> Callable[[str, str], Pair]:
    """`adapted(arch, kind)`: the tiny model with its `kind` adapter, loaded by both sides.

    The reference is mlx_lm.load's own steps (load_model, load_adapters, eval). Both sides
    share the tokenizer mlxd.load returned: it is the slow part of a load (~0.9 s), no
    adapter touches it, and test_generate_parity.py compares it with mlx-lm's."""
    from mlx_lm.utils import load_adapters, load_model

    cache: dict[tuple[str, str], Pair] = {}

    def get(arch: str, kind: str) -> Pair:
        if (arch, kind) not in cache:
            model = tiny_model(arch)
            adapter = str(tiny_adapter_dir(model, kind))
            ref_model, ref_config = load_model(model)
            load_adapters(ref_model, adapter).eval()
            got_model, got_tok, got_config = mlxd.load(
                str(model), adapter_path=adapter, return_config=True
            )
            pair = Pair(arch, model, ref_model, got_tok, ref_config, got_model, got_tok, got_config)
            cache[(arch, kind)] = pair
        return cache[(arch, kind)]

    yield get
    cache.clear()


@pytest.fixture(scope="module")
def base_model(tiny_model: Callable[..., Path]) -> Callable[[str], Any]:
    """`base_model(arch)`: the tiny model without an adapter (mlx-lm's load_model)."""
    from mlx_lm.utils import load_model

    cache: dict[str, Any] = {}

    def get(arch: str) -> Any:
        if arch not in cache:
            cache[arch] = load_model(tiny_model(arch))[0]
        return cache[arch]

    return get


def _prompt(tokenizer: Any) -> list[int]:
    return list(tokenizer.encode(PROMPT_TEXT)[:12])


def _kwargs(sampled: bool) -> dict[str, Any]:
    return {"max_tokens": TOKENS, **({"sampler": make_sampler(**SAMPLER)} if sampled else {})}


# LoRA and DoRA on every architecture; a full fine-tune (whole blocks, no adapter layers) on one.
CASES = [(arch, kind) for arch in ARCHS for kind in ("lora", "dora")] + [("llama", "full")]
assert {kind for _, kind in CASES} == set(FINE_TUNE_TYPES)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize(("arch", "kind"), CASES, ids=[f"{a}-{k}" for a, k in CASES])
def test_stream_generate_with_adapter(
    adapted, base_model: Callable[[str], Any], arch: str, kind: str, sampled: bool
) -> None:
    pair = adapted(arch, kind)
    if not sampled:
        assert_same_parameters(pair.ref_model, pair.got_model)
    prompt, seed = _prompt(pair.ref_tok), SEED if sampled else None
    ref = run_stream(
        mlx_lm.stream_generate, pair.ref_model, pair.ref_tok, prompt, seed=seed, **_kwargs(sampled)
    )
    got = run_stream(
        mlxd.stream_generate, pair.got_model, pair.got_tok, prompt, seed=seed, **_kwargs(sampled)
    )
    assert ref.error is None and len(ref.tokens) == TOKENS
    assert_same_run(ref, got, f"{arch}/{kind}")
    base = run_stream(
        mlx_lm.stream_generate,
        base_model(arch),
        pair.ref_tok,
        prompt,
        seed=seed,
        **_kwargs(sampled),
    )
    assert base.tokens != ref.tokens, "the adapter did not change the output"


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_batch_generate_with_adapter(adapted, kind: str) -> None:
    """Rows of different lengths in one batch (mlxd's batched engine path)."""
    pair = adapted("qwen3", kind)
    ids = pair.ref_tok.encode(PROMPT_TEXT)
    prompts = [ids[:7], ids[3:15], ids[10:14]]
    kw = dict(max_tokens=6, return_token_ids=True, return_logprobs=True)
    ref = run_batch(mlx_lm.batch_generate, pair.ref_model, pair.ref_tok, prompts, seed=1, **kw)
    got = run_batch(mlxd.batch_generate, pair.got_model, pair.got_tok, prompts, seed=1, **kw)
    assert ref.error is None
    assert_same_batch(ref, got, kind)


def _cli(module: str, model: Path, adapter: Path, *extra: str) -> str:
    args = ["generate", "--model", str(model), "--adapter-path", str(adapter)]
    args += ["--prompt", "Write a haiku", "--max-tokens", "10", "--verbose", "False", *extra]
    r = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_generate_cli_with_adapter(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model("qwen3")
    adapter = tiny_adapter_dir(model, "dora")
    seeded = ("--temp", "0.8", "--seed", "7")
    ours, theirs = _cli("mlxd", model, adapter, *seeded), _cli("mlx_lm", model, adapter, *seeded)
    assert ours == theirs and ours.strip()


def test_serve_with_adapter(adapted, base_model: Callable[[str], Any], tmp_path: Path) -> None:
    """`mlxd serve --adapter-path`: a completion's token ids and logprobs are mlx-lm's."""
    from serve.conftest import start_server

    pair = adapted("llama", "lora")
    adapter = tiny_adapter_dir(pair.folder, "lora")
    prompt = "The weather today"
    body = {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0, "logprobs": True}
    live = start_server(model=str(pair.folder), adapter_path=str(adapter), data_dir=str(tmp_path))
    try:
        r = httpx.post(live.v1 + "/completions", json=body, timeout=120)
    finally:
        live.stop()
    assert r.status_code == 200, r.text
    tok = pair.ref_tok
    ref = run_stream(mlx_lm.stream_generate, pair.ref_model, tok, tok.encode(prompt), seed=None,
                     max_tokens=TOKENS)  # fmt: skip
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["id"] for e in content] == ref.tokens
    assert set(ref.logprob_dtype) == {"mlx.core.float32"}  # the tiny models are float32
    pairs = zip(ref.logprobs, ref.tokens, strict=True)
    want = [float(lp.view(np.float32)[t]) for lp, t in pairs]  # `bits` keeps the raw pattern
    assert [e["logprob"] for e in content] == want
    base = run_stream(mlx_lm.stream_generate, base_model("llama"), tok, tok.encode(prompt),
                      seed=None, max_tokens=TOKENS)  # fmt: skip
    assert base.tokens != ref.tokens, "the adapter did not change the output"
