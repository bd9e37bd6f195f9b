"""Concurrent mode: N prompts admitted together, mlx-lm's BatchGenerator vs mlxd's Engine at the
same batch composition (same capacity, same prefill batch), timed per stream at the consumer.
With quantized KV the mlx-lm side is what mlx_lm.server runs: one stream after another."""

import asyncio
import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.sample_utils import make_logits_processors

from ..engine.engine import Engine
from ..engine.request import GenerationRequest
from ..engine.sampling import SamplingParams
from .report import percentile


def metrics(t0: float, stamps: list[list[float]], peak_bytes: int) -> dict[str, Any]:
    """Aggregate and per-stream figures from each stream's token arrival times."""
    firsts, lasts = [s[0] for s in stamps], [s[-1] for s in stamps]
    total, n = sum(len(s) for s in stamps), len(stamps)
    ttfts = [f - t0 for f in firsts]
    itls = [1e3 * (b - a) for s in stamps for a, b in zip(s, s[1:], strict=False)]
    decode_window = max(lasts) - min(firsts)
    return {
        "generated": total,
        # Tokens after each stream's first, over the span in which streams were decoding.
        "decode_tok_s": (total - n) / decode_window if decode_window > 0 else 0.0,
        "e2e_tok_s": total / (max(lasts) - t0),  # admission to the last token, prefill included
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_ms": percentile(itls, 50) if itls else 0.0,
        "itl_p99_ms": percentile(itls, 99) if itls else 0.0,
        "peak_memory_gb": peak_bytes / 1e9,
        "ttft_s": ttfts,
        "token_times_ms": [[round(1e3 * (t - t0), 3) for t in s] for s in stamps],
    }


def run_mlx_lm(
    model: Any,
    prompts: list[list[int]],
    gen_tokens: int,
    capacity: int,
    prefill_step_size: int,
    bias: dict[int, float] | None = None,
) -> tuple[float, list[list[float]], list[list[int]]]:
    """BatchGenerator as the anchors bench drives it: insert all, next_generated() until done."""
    t0 = time.perf_counter()
    gen = BatchGenerator(
        model,
        completion_batch_size=capacity,
        prefill_batch_size=min(capacity, 8),  # what mlxd's batched step uses
        prefill_step_size=prefill_step_size,
    )
    procs = [make_logits_processors(bias) for _ in prompts]  # [] each when bias is None
    uids = gen.insert(prompts, max_tokens=[gen_tokens] * len(prompts), logits_processors=procs)
    stamps: dict[int, list[float]] = {u: [] for u in uids}
    tokens: dict[int, list[int]] = {u: [] for u in uids}
    while responses := gen.next_generated():
        now = time.perf_counter()  # one step's tokens all arrive together
        for r in responses:
            stamps[r.uid].append(now)
            tokens[r.uid].append(int(r.token))
    gen.close()
    return t0, [stamps[u] for u in uids], [tokens[u] for u in uids]


def run_mlx_lm_serial(
    model: Any, prompts: list[list[int]], gen_tokens: int, step: int, kv: dict[str, Any]
) -> tuple[float, list[list[float]], list[list[int]]]:
    """What mlx_lm.server does with --kv-bits (`_is_batchable` is false): the streams run one
    after another, each on generate_step, all submitted at t0."""
    t0 = time.perf_counter()
    stamps: list[list[float]] = []
    tokens: list[list[int]] = []
    for prompt in prompts:
        stamps.append([])
        tokens.append([])
        run = generate_step(
            mx.array(prompt), model, max_tokens=gen_tokens, prefill_step_size=step, **kv
        )
        for token, _ in run:
            stamps[-1].append(time.perf_counter())
            tokens[-1].append(int(token))
    return t0, stamps, tokens


def run_mlxd(
    engine: Engine,
    prompts: list[mx.array],
    gen_tokens: int,
    bias: dict[int, float] | None = None,
    kv: dict[str, Any] | None = None,
) -> tuple[float, list[list[float]], list[list[int]]]:
    """Engine.submit_many, each handle read with `async for` on one event loop (as a server)."""
    sampling = SamplingParams(logit_bias=bias) if bias else None
    reqs = [
        GenerationRequest(prompt=p, max_tokens=gen_tokens, sampling=sampling, **(kv or {}))
        for p in prompts
    ]

    async def consume(handle: Any) -> tuple[list[float], list[int]]:
        stamps, tokens = [], []
        async for event in handle:
            stamps.append(time.perf_counter())
            tokens.append(int(event.token))
        return stamps, tokens

    async def main() -> tuple[float, list[tuple[list[float], list[int]]]]:
        t0 = time.perf_counter()
        handles = engine.submit_many(reqs)
        return t0, await asyncio.gather(*(consume(h) for h in handles))

    t0, results = asyncio.run(main())
    return t0, [s for s, _ in results], [t for _, t in results]
