"""The RAM tier against mlx-lm's LRUPromptCache (the oracle for eviction order and for which
prefix a prompt gets), plus what mlxd adds: a byte cap that holds, refresh on use, idle demotion
to the disk tier."""

import random
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, LRUPromptCache

from mlxd.store import PrefixStore
from mlxd.store.ram import KINDS, Entry, RAMTier
from mlxd.store.ssd import SSDTier


def kv(n: int, dim: int = 8) -> list[KVCache]:
    """A one-layer cache holding `n` positions (distinct values per length)."""
    c = KVCache()
    x = mx.arange(n * dim, dtype=mx.float32).reshape(1, 1, n, dim) + n
    c.update_and_fetch(x, x)
    mx.eval(c.keys, c.values)
    return [c]


def entry(tokens: list[int], kind: str) -> Entry:
    cache = kv(len(tokens))
    return Entry("m", np.asarray(tokens, dtype=np.int32), cache, cache[0].nbytes, kind)


@pytest.mark.parametrize("seed", range(5))
def test_eviction_follows_mlx_lm_lru_prompt_cache(seed: int) -> None:
    """Random inserts of every kind under an entry cap: the same entries survive as in mlx-lm."""
    rng = random.Random(seed)
    ours, theirs = RAMTier(max_bytes=1 << 40, max_entries=5), LRUPromptCache(max_size=5)
    for i in range(40):
        tokens = [i + 1, *rng.sample(range(100, 200), rng.randint(2, 6))]
        kind = rng.choice(KINDS)
        e = entry(tokens, kind)
        ours.insert(e)
        theirs.insert_cache("m", tokens, e.cache, cache_type=kind)
        mine = sorted(tuple(x.tokens.tolist()) for x in ours.entries())
        oracle = sorted(tuple(t) for q in theirs._lru._lrus.values() for _, t in q)
        assert mine == oracle


def test_nearest_prefix_agrees_with_mlx_lm() -> None:
    """Exact, shorter and longer (trimmed) entries: the same number of tokens is served."""
    ours, theirs = RAMTier(1 << 40, 50), LRUPromptCache(max_size=50)
    stored = [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [1, 9, 9, 9], [5, 6]]
    for tokens in stored:
        e = entry(tokens, "assistant")
        ours._entries["m"].append(e)  # no supersession: compare lookups only
        ours._lru["assistant"][id(e)] = e
        theirs._trie.add("m", tokens, LRUPromptCache.CacheEntry(e.cache, 1, "assistant"))
    for prompt in ([1, 2, 3, 4, 9, 9], [1, 2, 3], [1, 9, 9, 9, 9], [1, 2, 3, 4, 5, 6, 7, 8], [7]):
        hit = ours.match("m", np.asarray(prompt, dtype=np.int32), len(prompt) - 1)
        _, rest = theirs.fetch_nearest_cache("m", prompt)
        n_theirs = len(prompt) - len(rest)
        assert (hit[1] if hit else 0) == min(n_theirs, len(prompt) - 1), prompt


def test_a_trimmable_entry_supersedes_its_prefixes_but_not_others() -> None:
    tier = RAMTier(1 << 40, 10)
    tier.insert(entry([1, 2, 3], "system"))
    tier.insert(entry([1, 2, 7], "user"))
    tier.insert(entry([1, 2, 3, 4, 5], "assistant"))
    assert sorted(e.tokens.tolist() for e in tier.entries()) == [[1, 2, 3, 4, 5], [1, 2, 7]]


def test_byte_cap_and_refresh_on_use() -> None:
    one = entry([0, 1, 2, 3], "assistant").nbytes
    tier = RAMTier(max_bytes=3 * one, max_entries=100)
    a, b, c = (entry([k, 1, 2, 3], "assistant") for k in (10, 20, 30))
    for e in (a, b, c):
        tier.insert(e)
    tier.touch(a)  # a was used: b is now the oldest
    tier.insert(entry([40, 1, 2, 3], "assistant"))
    assert tier.nbytes <= tier.max_bytes
    left = {int(e.tokens[0]) for e in tier.entries()}
    assert left == {10, 30, 40}
    assert tier.insert(entry(list(range(5000)), "assistant"))  # bigger than the cap: refused
    assert tier.nbytes <= tier.max_bytes


def test_idle_entries_are_demoted_to_disk_and_leave_ram(tmp_path: Path) -> None:
    ssd = SSDTier(tmp_path, 1 << 30)
    store = PrefixStore(max_entries=10, ssd=ssd, demote_idle_s=0.2)
    tokens = list(range(1, 65))
    store.insert("m", tokens, kv(64))
    ssd.flush()
    assert len(store.ram) == 1 and ssd.stats()["entries"] == 1
    time.sleep(1.1)
    store.tick()
    assert len(store.ram) == 0 and store.ram.nbytes == 0
    hit = store.lookup("m", tokens + [99])
    assert hit is not None and hit.source == "ssd" and hit.length == 64
    assert mx.array_equal(hit.cache[0].state[0], kv(64)[0].state[0]).item()
    assert len(store.ram) == 1  # restored entries come back to RAM
    store.close()


def test_disk_is_skipped_when_recomputing_is_faster(tmp_path: Path) -> None:
    """The disk tier competes with prefilling: with measured speeds that make a restore slower
    than recomputing the tokens, the lookup misses instead (and counts the skip)."""
    ssd = SSDTier(tmp_path, 1 << 30)
    store = PrefixStore(max_entries=10, ssd=ssd)
    tokens = list(range(1, 65))
    store.insert("m", tokens, kv(64))
    ssd.flush()
    store.ram.remove(store.ram.entries()[0])  # only the disk has it now
    nbytes = ssd.match("m", tokens)[0].nbytes
    store.restore_bytes_per_s = float(nbytes)  # one second to read it
    store.observe_prefill(64_000, 1.0)  # 64 tokens in a millisecond
    assert store.lookup("m", tokens + [99]) is None and store.counts["ssd_skipped"] >= 1
    store.prefill_tokens_per_s = 10.0  # 6.4 s to recompute: now the disk wins
    hit = store.lookup("m", tokens + [99])
    assert hit is not None and hit.source == "ssd"
    store.close()
