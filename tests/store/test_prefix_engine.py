"""The prefix store as the engine uses it: reuse at admission, non-consuming hits, one prefill
for a shared prefix, prompt-boundary snapshots for caches that cannot be trimmed, the
deterministic mode, and namespaces per KV scheme."""

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import pytest

from mlxd.engine import Engine, GenerationRequest
from mlxd.store import PrefixStore


def words(seed: int, n: int) -> list[int]:
    """`n` token ids from a seeded stream, away from special tokens."""
    return mx.random.randint(1000, 20000, (n,), key=mx.random.key(seed)).tolist()


@pytest.fixture
def engine(tiny_lm: Callable[[str], Any]) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(arch: str = "qwen3", store: PrefixStore | None = None, **kw: Any) -> Engine:
        store = store if store is not None else PrefixStore(max_entries=50)
        e = Engine(tiny_lm(arch), prefix_store=store, namespace="tiny", **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def run(engine: Engine, prompt: list[int], max_tokens: int = 6, **kw: Any):
    h = engine.submit(GenerationRequest(prompt=mx.array(prompt), max_tokens=max_tokens, **kw))
    events = list(h)
    return [e.token for e in events], [e.logprobs for e in events], h


def same_logprobs(a: list[mx.array], b: list[mx.array]) -> bool:
    return len(a) == len(b) and all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))


def test_repeat_hits_all_but_last_token_and_gives_the_same_bits(engine) -> None:
    e = engine()
    prompt = words(1, 300)
    toks, lps, h = run(e, prompt)
    assert h.done.cached_tokens == 0 and h.cached_tokens == 0
    toks2, lps2, h2 = run(e, prompt)
    assert h2.done.cached_tokens == len(prompt) - 1
    assert toks2 == toks and same_logprobs(lps2, lps)


def test_next_turn_hits_the_whole_history(engine) -> None:
    e = engine()
    prompt = words(2, 200)
    toks, _, _ = run(e, prompt, max_tokens=8)
    nxt = prompt + toks + words(3, 20)
    _, _, h = run(e, nxt)
    assert h.done.cached_tokens >= len(prompt) + len(toks) - 1


def test_hits_do_not_consume_the_donor(engine) -> None:
    """Agent B reusing agent A's system prompt leaves A's whole entry: A's next turn still hits
    its full history, with the same bits as on an engine where B never ran."""
    system = words(4, 256)
    a1 = system + words(5, 30)
    results = []
    for with_b in (True, False):
        e = engine()
        toks_a, _, _ = run(e, a1, max_tokens=8)
        if with_b:
            _, _, hb = run(e, system + words(6, 30))
            assert hb.done.cached_tokens >= len(system)
        a2 = a1 + toks_a + words(7, 10)
        toks, lps, ha = run(e, a2)
        assert ha.done.cached_tokens >= len(a1) + len(toks_a) - 1
        results.append((toks, lps))
    assert results[0][0] == results[1][0] and same_logprobs(results[0][1], results[1][1])


class CountingModel:
    """The model, counting the token positions each forward pass computes."""

    def __init__(self, model: Any) -> None:
        self.__dict__["_model"] = model
        self.__dict__["positions"] = 0

    def __call__(self, inputs: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        self.__dict__["positions"] += inputs.shape[0] * inputs.shape[1]
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@pytest.mark.parametrize("staggered", [False, True])
def test_a_shared_prefix_is_prefilled_once(tiny_lm, staggered: bool) -> None:
    """N prompts with one long prefix, arriving together (or one just before the others): the
    prefix is computed once, not N times."""
    model = CountingModel(tiny_lm("qwen3"))
    e = Engine(model, batch=4, prefix_store=PrefixStore(max_entries=50), namespace="tiny")
    try:
        prefix, n, suffix = words(8, 512), 4, 8
        prompts = [prefix + [30000 + i] + words(10 + i, suffix - 1) for i in range(n)]
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=2) for p in prompts]
        if staggered:
            handles = [e.submit(reqs[0])] + e.submit_many(reqs[1:])
        else:
            handles = e.submit_many(reqs)
        for h in handles:
            list(h)
        requested = sum(len(p) for p in prompts)
        decode = n * 2  # one position per generated token (the last is fed too)
        computed = model.positions - decode
        assert computed <= len(prefix) + n * suffix + n, (computed, requested)
        assert sorted(h.done.cached_tokens for h in handles)[1:] == [len(prefix)] * (n - 1)
    finally:
        e.close()


def test_joiners_are_matched_once_each_not_once_per_pair(
    tiny_lm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents coming back together with a stored system prompt: admission reads each prompt
    and peeks the store a bounded number of times per joiner, not once per pair of joiners
    (465 pairs for 31 joiners cost ~0.3 s of an H200 host's admission)."""
    peeks: list[int] = []
    peek = PrefixStore.peek
    monkeypatch.setattr(PrefixStore, "peek", lambda *a: (peeks.append(1), peek(*a))[1])
    e = Engine(tiny_lm("qwen3"), batch=16, prefix_store=PrefixStore(max_entries=50),
               namespace="tiny")  # fmt: skip
    try:
        system = words(40, 300)
        run(e, system + words(41, 5), max_tokens=1)  # stores the system prompt
        reqs = [
            GenerationRequest(prompt=mx.array(system + words(50 + i, 6)), max_tokens=1)
            for i in range(16)
        ]
        peeks.clear()
        handles = e.submit_many(reqs)
        for h in handles:
            list(h)
        assert all(h.done.cached_tokens == len(system) for h in handles)
        assert e.paths["waited for a shared prefix"] == 0
        assert len(peeks) <= 2 * len(reqs), len(peeks)  # 120 pairs before
    finally:
        e.close()


def test_byte_cap_holds_for_many_prompts(engine) -> None:
    store = PrefixStore(max_bytes=3 * 300_000, max_entries=100)
    e = engine(store=store)
    seen = 0
    for i in range(12):
        run(e, words(100 + i, 60 + 20 * i), max_tokens=2)
        held = sum(c.nbytes for entry in store.ram.entries() for c in entry.cache)
        assert held == store.ram.nbytes <= store.ram.max_bytes
        seen = max(seen, len(store.ram))
    assert seen >= 2 and store.counts["inserted"] > len(store.ram)  # entries were evicted


@pytest.mark.parametrize("arch", ["gemma3", "lfm2"])
def test_untrimmable_caches_hit_at_the_prompt_boundary(engine, arch: str) -> None:
    """A sliding-window cache that wrapped, or recurrent state, cannot be cut back to the next
    turn's prefix: the snapshot at the prompt minus its last token still serves it."""
    e = engine(arch)
    prompt = words(20, 120)  # far past gemma3's 16-token window
    toks, _, _ = run(e, prompt, max_tokens=4)
    assert not e.sharing.store.ram.entries()[0].trimmable
    _, _, h = run(e, prompt[:-1] + [prompt[-1] + 1] + words(21, 5))  # a re-rendered next turn
    assert h.done.cached_tokens == len(prompt) - 1


def test_deterministic_mode_hit_equals_miss(engine) -> None:
    """With the grid, a hit gives the same tokens and logprobs as a fresh engine's miss."""
    step = 32
    shared = words(30, 100)
    other, target = shared + words(31, 40), shared + words(32, 45)
    cold = engine(store=PrefixStore(grid=step), batch=1, prefill_step_size=step)
    toks_miss, lps_miss, _ = run(cold, target, prefill_step_size=step)
    warm = engine(store=PrefixStore(grid=step), batch=1, prefill_step_size=step)
    run(warm, other, prefill_step_size=step)
    toks_hit, lps_hit, h = run(warm, target, prefill_step_size=step)
    assert h.done.cached_tokens == 96  # 100 shared tokens, on the 32-token grid
    assert toks_hit == toks_miss and same_logprobs(lps_hit, lps_miss)


def test_entries_never_cross_kv_schemes(engine) -> None:
    e = engine()
    prompt = words(40, 100)
    run(e, prompt)
    _, _, h = run(e, prompt, kv_bits=8, quantized_kv_start=0)
    assert h.done.cached_tokens == 0
    _, _, h = run(e, prompt, kv_bits=8, quantized_kv_start=0)
    assert h.done.cached_tokens == len(prompt) - 1


def test_a_request_with_its_own_cache_bypasses_the_store(engine, tiny_lm) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    e = engine()
    prompt = words(50, 80)
    run(e, prompt)
    own = make_prompt_cache(tiny_lm("qwen3"))
    _, _, h = run(e, prompt, prompt_cache=own)
    assert h.done.cached_tokens == 0 and own[0].offset >= len(prompt)


def test_a_batched_donor_shares_its_prefix_too(tiny_lm) -> None:
    """While another row decodes, the donor of a shared prefix prefills inside the batch; the
    others wait for the snapshot its batched prefill takes, then hit it."""
    model = CountingModel(tiny_lm("qwen3"))
    e = Engine(model, batch=4, prefix_store=PrefixStore(max_entries=50), namespace="tiny")
    try:
        busy = e.submit(GenerationRequest(prompt=mx.array(words(60, 16)), max_tokens=200))
        next(iter(busy))  # it decodes: new rows now join a batch
        prefix = words(61, 384)
        prompts = [prefix + [30000 + i] + words(62 + i, 7) for i in range(3)]
        handles = e.submit_many(
            [GenerationRequest(prompt=mx.array(p), max_tokens=2) for p in prompts]
        )
        for h in handles:
            list(h)
        busy.cancel()
        list(busy)
        assert e.paths["batched"] >= 3 and e.paths["waited for a shared prefix"] == 2, e.paths
        assert sorted(h.done.cached_tokens for h in handles)[1:] == [len(prefix)] * 2
    finally:
        e.close()


def test_a_turn_writes_its_whole_cache_to_disk_once(engine, tmp_path) -> None:
    """The prompt-boundary snapshot of a trimmable cache stays in RAM (the row's whole cache
    supersedes it); only the final entry is written through, and it serves the next turn."""
    from mlxd.store.ssd import SSDTier

    ssd = SSDTier(tmp_path, 1 << 30)
    e = engine(store=PrefixStore(max_entries=10, ssd=ssd))
    prompt = words(70, 100)
    toks, _, _ = run(e, prompt, max_tokens=4)
    ssd.flush()
    assert ssd.stats()["entries"] == 1
    namespace = e.sharing.namespace(GenerationRequest(prompt=mx.array(prompt)))
    entry, n = ssd.match(namespace, prompt + toks)
    assert len(entry.tokens) >= len(prompt) + len(toks) - 1 and n == len(entry.tokens)


def test_a_failing_store_costs_hits_not_rows(engine, monkeypatch) -> None:
    """Lookups, inserts and demotion that raise are logged; every row still completes with the
    tokens of an engine without a store."""
    plain = Engine(engine().model, batch=4)
    try:
        e = engine()
        store = e.sharing.store

        def boom(*_a, **_k):
            raise MemoryError("no room")

        for name in ("lookup", "insert", "tick", "trim_to"):
            monkeypatch.setattr(store, name, boom)
        prompts = [words(80 + i, 40) for i in range(3)]
        for p in prompts:
            toks, _, h = run(e, p)
            assert h.done.reason == "length" and h.done.cached_tokens == 0
            assert toks == run(plain, p)[0]
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=3) for p in prompts]
        handles = e.submit_many(reqs)
        for h in handles:
            list(h)
        assert [h.done.reason for h in handles] == ["length"] * 3
    finally:
        plain.close()


class ShapesModel(CountingModel):
    """The model, keeping each forward pass's (rows, tokens)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.__dict__["shapes"] = []

    def __call__(self, inputs: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        self.shapes.append(tuple(inputs.shape[:2]))
        return super().__call__(inputs, *args, **kwargs)


def test_the_donor_of_a_system_prompt_joins_its_wave_in_step(tiny_lm) -> None:
    """A fleet's turn 1: agents sharing a system prompt (a segment cut where it ends) and a few
    template tokens after it. The first prefills the system prompt alone and the others join
    it on its snapshot. Its feed is not cut again a few tokens later (a snapshot nobody waits
    for: the waiters are released by the system one), so every pass after the wave formed runs
    all the rows together and they finish on the same step (no lone prefill, no lone last row)."""
    model = ShapesModel(tiny_lm("qwen3"))
    e = Engine(model, batch=4, prefix_store=PrefixStore(max_entries=50), namespace="tiny")
    try:
        system, template = words(8, 300), [30001, 30002, 30003, 30004]
        prompts = [system + template + words(10 + i, 8) for i in range(4)]
        reqs = [
            GenerationRequest(prompt=mx.array(p), max_tokens=3, snapshot_at=((300, "system"),))
            for p in prompts
        ]
        handles = e.submit_many(reqs)
        for h in handles:
            list(h)
        wave = next(i for i, s in enumerate(model.shapes) if s[0] > 1)
        assert all(rows == 4 for rows, _ in model.shapes[wave:]), model.shapes
        assert e.paths["waited for a shared prefix"] == 3 and "batched->serial" not in e.paths
        assert sorted(h.done.cached_tokens for h in handles) == [0, 300, 300, 300]
    finally:
        e.close()


def test_prompt_ids_read_each_int_dtype_as_its_list_would() -> None:
    """Admission reads prompts through the array's buffer, not `tolist()` (prefix.prompt_ids)."""
    import numpy as np

    from mlxd.engine.prefix import prompt_ids

    for dtype in (mx.int32, mx.uint32, mx.int64):
        prompt = mx.array([5, 151643, 7, 0], dtype=dtype)
        ids = prompt_ids(GenerationRequest(prompt=prompt))
        assert ids.dtype == np.int32 and ids.tolist() == prompt.tolist()


def test_a_uint32_prompt_hits_what_an_int32_one_stored(engine) -> None:
    e = engine()
    prompt = words(7, 120)
    toks, lps, _ = run(e, prompt)
    h = e.submit(GenerationRequest(prompt=mx.array(prompt, dtype=mx.uint32), max_tokens=6))
    events = list(h)
    assert h.done.cached_tokens == len(prompt) - 1
    assert [x.token for x in events] == toks and same_logprobs([x.logprobs for x in events], lps)
