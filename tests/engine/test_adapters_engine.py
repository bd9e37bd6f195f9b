"""Per-row adapters in the engine: rows naming different adapters (or none) run in one batched
step, each with its own adapter; a lone row with an adapter has mlx-lm's bits exactly; the
registry refuses what it cannot serve; the prefix store never shares KV across adapters.

Adapters are tiny random LoRA / DoRA folders made with mlx-lm's tuner (fixtures/adapters.py);
the references are mlx-lm's own load_adapters and generate_step."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from fixtures.adapters import tiny_adapter_dir
from mlx_lm.generate import generate_step
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load_model

from mlxd.engine import Engine, GenerationRequest
from mlxd.engine.request import Speculation
from mlxd.store import PrefixStore

TOKENS = 6
PROMPTS = [
    [5, 17, 301, 42, 9, 77, 12],
    [8, 3, 99, 140],
    [61, 2, 33, 250, 7, 18],
    [44, 21, 6, 90, 13],
]
NAMES = ["a", "b", None, "a"]


@pytest.fixture(scope="module")
def tiny(tiny_model: Callable[..., Path]) -> Callable[[str], tuple[Path, dict[str, str]]]:
    """`tiny(arch)`: the model folder and its adapters: a (LoRA), b (DoRA, the last block)."""

    def get(arch: str) -> tuple[Path, dict[str, str]]:
        folder = tiny_model(arch)
        a = tiny_adapter_dir(folder, "lora", seed=1)
        b = tiny_adapter_dir(folder, "dora", num_layers=1, seed=2)
        return folder, {"a": str(a), "b": str(b)}

    return get


def reference(folder: Path, adapter: str | None, prompt: list[int], n: int = TOKENS) -> tuple:
    """mlx-lm alone: (tokens, logprob vectors) of greedy generate_step with the adapter."""
    model = load_model(folder)[0]
    if adapter is not None:
        load_adapters(model, adapter)
    model.eval()
    out = list(zip(generate_step(mx.array(prompt), model, max_tokens=n), range(n), strict=False))
    return [int(t) for (t, _), _ in out], [lp for (_, lp), _ in out]


def engine(folder: Path, adapters: dict[str, str], **kw: Any) -> Engine:
    e = Engine(load_model(folder)[0], batch=4, **kw)
    for name, path in adapters.items():
        e.load_adapter(name, path)
    return e


def run(e: Engine, names: list[str | None], prompts: list[list[int]] = PROMPTS) -> list[tuple]:
    """Submitted together (one admission round, one batch): each row's (tokens, logprobs)."""
    reqs = [
        GenerationRequest(mx.array(p), max_tokens=TOKENS, adapter=n)
        for p, n in zip(prompts, names, strict=True)
    ]
    out = []
    for h in e.submit_many(reqs):
        events = list(h)
        out.append(([ev.token for ev in events], [ev.logprobs for ev in events]))
        assert h.done is not None and h.done.reason == "length", h.done
    return out


def same_bits(x: tuple, y: tuple) -> bool:
    same = zip(x[1], y[1], strict=True)
    return x[0] == y[0] and all(mx.array_equal(a, b).item() for a, b in same)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_mixed_batch(tiny, arch: str) -> None:
    """Rows a, b, none, a in one batch: the adapter rows' tokens are mlx-lm's alone with that
    adapter (the batch's padding and composition change logprob bits, as for base rows); the
    base row has the bits of the same batch on an engine without adapters."""
    folder, adapters = tiny(arch)
    e = engine(folder, adapters)
    try:
        got = run(e, NAMES)
        assert e.paths["batched"] == 4
    finally:
        e.close()
    plain = Engine(load_model(folder)[0], batch=4)
    try:
        base = run(plain, [None] * 4)
    finally:
        plain.close()
    assert same_bits(got[2], base[2])
    for i, name in enumerate(NAMES):
        ref = reference(folder, adapters[name] if name else None, PROMPTS[i])
        assert got[i][0] == ref[0], (i, name)
        if name is not None:  # the adapter changed the row: the check could fail
            assert got[i][0] != base[i][0], (i, name)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("name", ["a", "b"])
def test_lone_row_is_mlx_lm(tiny, arch: str, name: str) -> None:
    """A lone row with an adapter (the serial path): mlx-lm's tokens and logprobs, bit for bit."""
    folder, adapters = tiny(arch)
    e = engine(folder, adapters)
    try:
        got = run(e, [name], PROMPTS[:1])[0]
        base = run(e, [None], PROMPTS[:1])[0]  # the base after an adapter row: slots cleared
        assert e.paths["serial"] == 2
    finally:
        e.close()
    assert same_bits(got, reference(folder, adapters[name], PROMPTS[0]))
    assert same_bits(base, reference(folder, None, PROMPTS[0]))
    assert got[0] != base[0]


def test_registry_refusals_and_reload(tiny) -> None:
    folder, adapters = tiny("llama")
    e = engine(folder, adapters)
    try:
        assert sorted(e.adapter_names()) == ["a", "b"]
        assert e.adapter_bytes("a") > 0
        with pytest.raises(ValueError, match="already loaded"):
            e.load_adapter("a", adapters["a"])
        with pytest.raises(ValueError, match="unknown adapter"):
            e.submit(GenerationRequest(mx.array(PROMPTS[0]), adapter="zzz"))
        for kw in ({"kv_bits": 4}, {"speculation": Speculation(mode="model")}):
            with pytest.raises(ValueError, match="not supported with adapters"):
                e.submit(GenerationRequest(mx.array(PROMPTS[0]), adapter="a", **kw))
        with pytest.raises(KeyError):
            e.unload_adapter("zzz")
        first = run(e, ["a"], PROMPTS[:1])[0]
        h = e.submit(GenerationRequest(mx.array(PROMPTS[1]), max_tokens=200, adapter="a"))
        with pytest.raises(ValueError, match="in use"):
            e.unload_adapter("a")  # counted from submit: refused whether it runs or waits
        h.wait()
        e.unload_adapter("a")
        assert e.adapter_names() == ["b"]
        with pytest.raises(ValueError, match="unknown adapter"):
            e.submit(GenerationRequest(mx.array(PROMPTS[0]), adapter="a"))
        assert run(e, ["b", None], PROMPTS[:2])  # the other adapter and the base still run
        e.load_adapter("a", adapters["a"])
        assert same_bits(run(e, ["a"], PROMPTS[:1])[0], first)
    finally:
        e.close()


def test_n_rows_of_one_prompt_each_run_the_adapter(tiny) -> None:
    """n > 1: the prompt prefilled once with the adapter, each sibling decoding with it (greedy:
    every sibling's tokens are the lone row's); the adapter is in use until the last ends."""
    folder, adapters = tiny("llama")
    e = engine(folder, adapters)
    try:
        alone = run(e, ["a"], PROMPTS[:1])[0]
        handles = e.submit_n(GenerationRequest(mx.array(PROMPTS[0]), max_tokens=TOKENS,
                                               adapter="a"), 3)  # fmt: skip
        with pytest.raises(ValueError, match="in use"):
            e.unload_adapter("a")
        got = [[ev.token for ev in h] for h in handles]
        assert got == [alone[0]] * 3
        assert got[0] != run(e, [None], PROMPTS[:1])[0][0]  # not the base model's
        e.unload_adapter("a")  # every sibling has ended
    finally:
        e.close()


def test_prefix_store_keeps_adapters_apart(tiny) -> None:
    """The same prompt with adapter a, then b: b never starts from a's KV (its output is b's
    without the store); a again does reuse a's, so the store was in play."""
    folder, adapters = tiny("qwen3")
    prompt = [(7 * i + 3) % 500 + 1 for i in range(40)]
    solo = engine(folder, adapters)
    try:
        want_b = run(solo, ["b"], [prompt])[0]
    finally:
        solo.close()
    e = engine(folder, adapters, prefix_store=PrefixStore(max_entries=50), namespace="tiny")
    try:
        hits = []
        for name in ("a", "b", "a"):
            h = e.submit(GenerationRequest(mx.array(prompt), max_tokens=TOKENS, adapter=name))
            events = list(h)
            hits.append(h.done.cached_tokens)
            if name == "b":
                got_b = ([ev.token for ev in events], [ev.logprobs for ev in events])
    finally:
        e.close()
    assert hits[0] == 0 and hits[1] == 0 and hits[2] > 0, hits
    assert same_bits(got_b, want_b)


def test_load_while_rows_run(tiny) -> None:
    """A running row's step holds the model's linears: an adapter that would wrap new ones
    waits for an idle engine; one over linears already wrapped loads at once."""
    folder, adapters = tiny("llama")
    e = engine(folder, {"b": adapters["b"]})  # DoRA on the last block only
    try:
        h = e.submit(GenerationRequest(mx.array(PROMPTS[1]), max_tokens=100_000, adapter="b"))
        next(iter(h))  # its row runs
        with pytest.raises(ValueError, match="while no rows run"):
            e.load_adapter("a", adapters["a"])  # LoRA on every block
        e.load_adapter("b2", adapters["b"])
        h.cancel()
        h.wait()
        e.load_adapter("a", adapters["a"])
        assert sorted(e.adapter_names()) == ["a", "b", "b2"]
    finally:
        e.close()
