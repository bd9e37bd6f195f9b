"""`--batched-attention folded+shared` in the engine (engine/shared_rows.py): a wave whose rows
share a long prefix decodes over one copy of it, a later wave joins against that copy, a row
without it turns the batch plain, rows leave and the last one moves to the serial path; the
tokens are folded attention's (float32 on the CPU: the sums' order differs, so logprobs agree
to rounding, not bit for bit: the mode is opt-in)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from fixtures.folded_models import load_model

from mlxd.engine.batch import BatchConfig
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.shared_rows import SharedPrefixes
from mlxd.kv.shared_prefix import SharedPrefixBatchKVCache
from mlxd.model import folded_attention as fa
from mlxd.store import PrefixStore

RNG = np.random.default_rng(0)
PREFIX = RNG.integers(5, 900, size=700).tolist()  # 640 shared after rounding down to 64


def _prompt(n: int, prefix: list[int] = PREFIX) -> list[int]:
    return prefix + RNG.integers(5, 900, size=n).tolist()


FIRST = [_prompt(n) for n in (5, 17, 3, 40)]
LATER = [_prompt(n) for n in (9, 2)]
OTHER = [_prompt(6, RNG.integers(5, 900, size=700).tolist())]


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]) -> Any:
    return load_model(tiny_model, "qwen3")


@pytest.fixture
def seen(monkeypatch) -> dict[str, int]:
    """Counts shared-prefix attention calls, waves split off (and against a running batch),
    and batches turned plain."""
    counts = {"attention": 0, "waves": 0, "joined": 0, "plain": 0}
    attention, share = fa.shared_prefix_attention, SharedPrefixes.share
    materialize = SharedPrefixBatchKVCache.materialize

    def spy_attention(*a):
        counts["attention"] += 1
        return attention(*a)

    def spy_share(self, caches, tokens):
        out = share(self, caches, tokens)
        if out is not caches:
            counts["waves"] += 1
            counts["joined"] += bool(self.running())
        return out

    def spy_materialize(self):
        counts["plain"] += self.prefix_keys is not None
        return materialize(self)

    monkeypatch.setattr(fa, "shared_prefix_attention", spy_attention)
    monkeypatch.setattr(SharedPrefixes, "share", spy_share)
    monkeypatch.setattr(SharedPrefixBatchKVCache, "materialize", spy_materialize)
    return counts


def _run(model, mode: str, groups: list[list[tuple[list[int], int]]], store=None):
    """Submit each group after the first group's first row has streamed 3 tokens; every row's
    (tokens, logprobs)."""
    engine = Engine(model, batch_config=BatchConfig(8, 8, 2048, attention=mode), prefix_store=store)
    try:
        handles, first = [], None
        for group in groups:
            reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=n) for p, n in group]
            hs = engine.submit_many(reqs)
            if first is None:
                first = iter(hs[0])
                early = [next(first) for _ in range(3)]
            handles += hs
        out = []
        for i, h in enumerate(handles):
            events = early + list(first) if i == 0 else list(h)
            out.append([(e.token, e.logprobs) for e in events])
        return out
    finally:
        engine.close()


# MLX-CUDA's float32 matmuls round through TF32 (10-bit mantissas): there the two sum orders
# differed by up to ~3e-3 in logprobs of ~15 (H200, session 23), the tokens equal.
TOL = 1e-4 if mx.default_device() == mx.cpu else 1e-2


def _same_tokens(got, ref) -> None:
    for g, r in zip(got, ref, strict=True):
        assert [t for t, _ in g] == [t for t, _ in r]
        for (_, a), (_, b) in zip(g, r, strict=True):
            assert mx.allclose(a, b, atol=TOL, rtol=TOL).item()


def test_a_wave_sharing_a_prefix_decodes_over_one_copy(model, seen) -> None:
    groups = [[(p, 12) for p in FIRST]]
    ref = _run(model, "folded", groups)
    got = _run(model, "folded+shared", groups)
    _same_tokens(got, ref)
    assert seen["waves"] == 1 and seen["attention"] > 0 and seen["plain"] == 0


def test_rows_leave_and_a_later_wave_joins_against_the_same_copy(model, seen) -> None:
    groups = [[(p, n) for p, n in zip(FIRST, (30, 8, 14, 22), strict=True)],
              [(p, 10) for p in LATER]]  # fmt: skip
    ref = _run(model, "folded", groups)
    got = _run(model, "folded+shared", groups)
    _same_tokens(got, ref)
    assert seen["joined"] >= 1 and seen["plain"] == 0


def test_a_row_without_the_prefix_turns_the_batch_plain(model, seen) -> None:
    groups = [[(p, 30) for p in FIRST], [(OTHER[0], 10)]]
    ref = _run(model, "folded", groups)
    got = _run(model, "folded+shared", groups)
    _same_tokens(got, ref)
    assert seen["waves"] == 1 and seen["plain"] == 2  # two layers


def test_a_short_common_prefix_is_not_split_off(model, seen) -> None:
    short = [RNG.integers(5, 900, size=300).tolist() + [i] for i in range(3)]
    _same_tokens(
        _run(model, "folded+shared", [[(p, 6) for p in short]]),
        _run(model, "folded", [[(p, 6) for p in short]]),
    )
    assert seen["waves"] == 0 and seen["attention"] == 0


def test_rows_stored_from_a_sharing_batch_serve_the_next_turn(model, seen) -> None:
    """Rows end with the prefix put back (extract): the store's entries are whole rows."""
    store = PrefixStore(max_entries=50)
    first = _run(model, "folded+shared", [[(p, 6) for p in FIRST]], store=store)
    turn = [p + [t for t, _ in r] + [11, 12] for p, r in zip(FIRST, first, strict=True)]
    got = _run(model, "folded+shared", [[(p, 6) for p in turn]], store=store)
    ref = _run(model, "folded", [[(p, 6) for p in turn]])
    _same_tokens(got, ref)
    assert store.stats()["hits"] >= len(turn)


def test_a_server_in_shared_mode_answers_as_folded_on_cpu(tiny_model, tmp_path, seen) -> None:
    """`mlxd serve --batched-attention folded+shared`: concurrent requests with one long system
    prompt get folded attention's text, over one copy of the prompt."""
    import asyncio

    import httpx

    from mlxd.cli import build_parser
    from mlxd.serve.app import build_app
    from mlxd.serve.main import make_state

    system = " ".join(f"rule {i}: answer briefly." for i in range(150))  # ~900 tokens
    asks = ["Tell me a story", "The sea is", "One two three four five six seven"]

    def answers(mode: str) -> list[str]:
        args = ["serve", "--model", str(tiny_model("qwen3")), "--data-dir", str(tmp_path / mode)]
        state = make_state(build_parser().parse_args([*args, "--batched-attention", mode]))
        transport = httpx.ASGITransport(app=build_app(state))

        async def post_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                bodies = [
                    {
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": a},
                        ],
                        "max_tokens": 12,
                        "temperature": 0,
                    }
                    for a in asks
                ]
                return await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=b) for b in bodies)
                )

        try:
            responses = asyncio.run(post_all())
        finally:
            state.provider.close()
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        return [r.json()["choices"][0]["message"]["content"] for r in responses]

    assert answers("folded+shared") == answers("folded")
    assert seen["waves"] >= 1 and seen["attention"] > 0


def test_the_attention_module_serves_one_row_and_refuses_a_prefill(model) -> None:
    """A sharing batch down to one row still attends over the copy (as mlx-lm's attention over
    the whole row); a multi-token input over a sharing cache is refused by name."""
    from mlx_lm.models.cache import KVCache

    from mlxd.kv.batch_roll import RollingBatchKVCache

    attn = fa.folded(model).model.layers[0].self_attn
    inner = model.model.layers[0].self_attn
    mx.random.seed(2)
    k = mx.random.normal(
        (1, inner.n_kv_heads, 700, inner.k_proj.weight.shape[0] // inner.n_kv_heads)
    )
    row = KVCache()
    row.update_and_fetch(k, k + 1)
    plain, other = RollingBatchKVCache.merge([row]), RollingBatchKVCache.merge([row])
    shared = SharedPrefixBatchKVCache.split_off(other, tuple(range(640)))
    x = mx.random.normal((1, 1, model.args.hidden_size))
    ref = inner(x, mask=plain.make_mask(1), cache=plain)
    got = attn(x, mask=shared.make_mask(1), cache=shared)
    assert mx.allclose(got, ref, atol=1e-5, rtol=1e-5).item()
    with pytest.raises(ValueError, match="only decodes"):
        attn(
            mx.random.normal((1, 2, model.args.hidden_size)), mask=shared.make_mask(2), cache=shared
        )
