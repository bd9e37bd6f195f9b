"""Running streams while a long prompt is admitted: their inter-token latency before and
during the admission, and the long prompt's time to first token, for mlxd's engine and for
mlx-lm's BatchGenerator doing the same work (chunked prefill is the point: no freeze)."""

import threading
import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlxd.bench.report import percentile
from mlxd.engine import Engine, GenerationRequest


def _itl(stamps: list[list[float]], start: float, end: float) -> list[float]:
    """Gaps between consecutive tokens of each stream that end inside [start, end]."""
    gaps = []
    for s in stamps:
        gaps += [b - a for a, b in zip(s, s[1:], strict=False) if start <= b <= end]
    return gaps


def _summary(stamps: list[list[float]], t_join: float, t_first: float) -> dict[str, Any]:
    before = _itl(stamps, 0.0, t_join)
    during = _itl(stamps, t_join, t_first)
    ms = 1000.0
    return {
        "itl_before_p50_ms": percentile(before, 50) * ms,
        "itl_during_p50_ms": percentile(during, 50) * ms,
        "itl_during_max_ms": max(during, default=0.0) * ms,
        "tokens_during": len(during),
        "long_ttft_s": t_first - t_join,
    }


def run_mlxd(model: Any, shorts: list[list[int]], long: list[int], gen: int, warm: int,
             chunk: int) -> dict[str, Any]:  # fmt: skip
    engine = Engine(model, batch=len(shorts) + 1, prefill_step_size=chunk)
    stamps: list[list[float]] = [[] for _ in shorts]
    try:
        handles = engine.submit_many(
            [GenerationRequest(mx.array(p), max_tokens=gen) for p in shorts]
        )

        def consume(i: int) -> None:
            for _ in handles[i]:
                stamps[i].append(time.perf_counter())

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(shorts))]
        for t in threads:
            t.start()
        while min(len(s) for s in stamps) < warm:
            time.sleep(0.0005)
        t_join = time.perf_counter()
        long_handle = engine.submit(GenerationRequest(mx.array(long), max_tokens=1))
        next(iter(long_handle))
        t_first = time.perf_counter()
        for t in threads:
            t.join()
    finally:
        engine.close()
    return _summary(stamps, t_join, t_first)


def run_mlx_lm(model: Any, shorts: list[list[int]], long: list[int], gen: int, warm: int,
               chunk: int) -> dict[str, Any]:  # fmt: skip
    bg = BatchGenerator(model, completion_batch_size=len(shorts) + 1, prefill_step_size=chunk)
    uids = bg.insert(shorts, max_tokens=[gen] * len(shorts))
    stamps = {u: [] for u in uids}
    long_uid, t_join, t_first = None, 0.0, 0.0
    while responses := bg.next_generated():
        now = time.perf_counter()
        for r in responses:
            if r.uid == long_uid:
                t_first = now
            else:
                stamps[r.uid].append(now)
        if long_uid is None and min(len(s) for s in stamps.values()) >= warm:
            t_join = time.perf_counter()
            (long_uid,) = bg.insert([long], max_tokens=[1])
    bg.close()
    return _summary(list(stamps.values()), t_join, t_first)


def main() -> None:
    """`python -m bench.probes.long_prompt`: both sides, interleaved rounds, on a random shape."""
    import argparse
    import json

    from mlxd.bench.models import build_random, random_prompts

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--random-shape", default="tiny")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--long-tokens", type=int, default=16384)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--warm-tokens", type=int, default=16)
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    bm = build_random(a.random_shape, a.dtype)
    shorts = random_prompts(bm.vocab_size, a.streams, 64, seed=1)
    long = random_prompts(bm.vocab_size, 1, a.long_tokens, seed=2)[0]
    args = (bm.model, shorts, long, a.gen_tokens, a.warm_tokens, a.prefill_step_size)
    results: dict[str, list] = {"mlx-lm": [], "mlxd": []}
    for r in range(a.rounds + 1):  # round 0 warms the kernels up
        for name, fn in (("mlx-lm", run_mlx_lm), ("mlxd", run_mlxd)):
            out = fn(*args)
            print(f"round {r} {name}: {json.dumps(out)}", flush=True)
            if r:
                results[name].append(out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
