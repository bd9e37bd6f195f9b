"""SSD tier from the engine's side: submit never blocks, match picks the right entry, and the
background writer is safe next to an engine thread running MLX work."""

import threading
import time
from typing import Any

import mlx.core as mx
import pytest
from store.helpers import (
    BIG,
    arrays_cache,
    files,
    kv_cache,
    next_logits,
    prompt_cache,
    random_tokens,
    snapshot,
    write,
)

from mlxd.engine.overlap import run_on_worker
from mlxd.store import ssd_format
from mlxd.store.ssd import SSDTier


def test_submit_never_waits_for_a_stuck_writer(tmp_path, monkeypatch) -> None:
    gate, busy, real = threading.Event(), threading.Event(), ssd_format.write

    def stuck(*args: Any) -> None:
        busy.set()
        assert gate.wait(30)  # each write takes as long as the test wants
        real(*args)

    monkeypatch.setattr(ssd_format, "write", stuck)
    tier = SSDTier(tmp_path, BIG, queue_depth=2)
    caches = [kv_cache(i) for i in range(10)]
    try:
        assert tier.submit("ns", [0], caches[0])
        assert busy.wait(10)  # the writer holds entry 0; the queue is empty
        start = time.perf_counter()
        results = [tier.submit("ns", [i], caches[i]) for i in range(1, 10)]
        assert time.perf_counter() - start < 0.5
        assert results == [True, True] + [False] * 7  # the queue holds 2
        assert tier.stats()["dropped"] == 7
        assert tier.submit("ns", [1], caches[1])  # already pending: skipped, not dropped
        assert tier.stats()["skipped"] == 1 and tier.stats()["pending"] == 3
        assert not tier.flush(timeout=0.05)
        gate.set()
        assert tier.flush(10)
        assert tier.stats()["written"] == 3 and len(files(tier)) == 3
        assert tier.submit("ns", [0], caches[0]) and tier.stats()["skipped"] == 2  # stored
    finally:
        gate.set()
        tier.close()


def test_submit_after_close_is_dropped(tmp_path) -> None:
    tier = SSDTier(tmp_path, BIG)
    tier.close()
    assert not tier.submit("ns", [1], kv_cache(1))
    assert tier.stats()["dropped"] == 1


def test_match_picks_the_entry_serving_most_tokens(tmp_path) -> None:
    prompt = [1, 2, 3, 4, 5, 6]
    tier = SSDTier(tmp_path, BIG)
    try:
        prefix = write(tier, "ns", [1, 2], kv_cache(1))
        assert tier.match("ns", prompt) == (prefix, 2)
        write(tier, "ns", [1, 2, 3, 4, 5, 9], arrays_cache(2))  # longer, cannot be trimmed
        assert tier.match("ns", prompt) == (prefix, 2)
        trimmable = write(tier, "ns", [1, 2, 3, 4, 9, 9, 9], kv_cache(3))
        assert tier.match("ns", prompt) == (trimmable, 4)  # usable: the common prefix
        other = write(tier, "other", prompt, kv_cache(4))
        assert tier.match("ns", prompt) == (trimmable, 4)
        assert tier.match("other", prompt) == (other, 6)
        exact = write(tier, "ns", [1, 2, 3, 4, 5], arrays_cache(5))  # a prefix: no trim needed
        assert tier.match("ns", prompt) == (exact, 5)
        assert tier.match("ns", [1, 2, 3, 4, 5]) == (exact, 5)
        assert tier.match("ns", [7, 8]) is None
        assert tier.match("nobody", prompt) is None
        assert tier.match("ns", []) is None
    finally:
        tier.close()


@pytest.mark.parametrize("slow_writer", [False, True])
def test_writer_beside_a_busy_engine_thread(tiny_lm, tmp_path, monkeypatch, slow_writer) -> None:
    """An engine-like thread prefills, submits, then keeps decoding into the very same cache
    and runs matmuls, while the writer writes 20 entries. Each file must hold the cache as it
    was at submit (a slow writer reads only after the engine has updated those layers)."""
    if slow_writer:
        real = ssd_format.write

        def slow(*args: Any) -> None:
            time.sleep(0.02)
            real(*args)

        monkeypatch.setattr(ssd_format, "write", slow)
    model = tiny_lm("qwen3")
    tier = SSDTier(tmp_path, BIG, queue_depth=32)
    submitted: list[tuple[list[int], Any, bool]] = []

    def engine() -> None:
        x = mx.random.normal((256, 256), key=mx.random.key(0))
        for i in range(20):
            tokens = random_tokens(100 + i, 12)
            cache = prompt_cache(model, tokens)
            submitted.append((tokens, snapshot(cache), tier.submit("ns", tokens, cache)))
            for t in range(3):  # in-place slice updates of the submitted layers
                next_logits(model, cache, [i + t])
            for _ in range(4):
                x = mx.tanh(x @ x / 16.0)
                mx.eval(x)

    done = threading.Event()
    run_on_worker(engine, done)  # a pooled thread, as the engine's own loop runs on
    try:
        assert done.wait(60) and len(submitted) == 20
        assert all(ok for _, _, ok in submitted)
        assert tier.flush(30)
        stats = tier.stats()
        assert (stats["written"], stats["errors"], stats["dropped"]) == (20, 0, 0)
        for tokens, snap, _ in submitted:
            hit = tier.match("ns", tokens)
            assert hit is not None and hit[1] == 12
            restored = tier.restore(hit[0])
            assert restored is not None and snapshot(restored) == snap
    finally:
        tier.close()
