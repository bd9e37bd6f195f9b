"""`mlxd bench generate`: mlx-lm and mlxd side by side on one model in one process, rounds
interleaved A B A B so machine drift hits both sides alike; greedy tokens are compared (with
each side against itself as the control for a nondeterministic backend)."""

import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.generate import stream_generate as mlx_lm_stream_generate
from tqdm import tqdm

from ..config import EngineConfig
from ..engine import stream_generate as mlxd_stream_generate
from ..engine.api import engine_for
from ..engine.engine import Engine
from . import concurrent
from .models import BenchModel, build_random, load_ref, random_prompts
from .report import (
    CONCURRENT_METRICS,
    SINGLE_METRICS,
    consistency,
    percentile,
    render,
    summarize,
)


def _fresh() -> None:
    # Every run starts from the same allocator state, so the peaks of the two sides compare.
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()


def kv_flags(args: Any) -> dict[str, Any] | None:
    """--kv-bits and its companions as stream_generate arguments (None: unquantized)."""
    if getattr(args, "kv_bits", None) is None:
        return None
    return dict(
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
        quantized_kv_start=args.quantized_kv_start,
    )


def single_run(
    stream_fn: Callable[..., Any],
    bm: BenchModel,
    prompt: mx.array,
    gen: int,
    step: int,
    kv: dict[str, Any] | None = None,
    model: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One stream_generate call, timed at the consumer like a user would time it. `kv`: the
    KV scheme flags (kv_bits, kv_group_size, quantized_kv_start), the same on both sides;
    `model` / `extra`: this side's own model object and arguments (an adapter's)."""
    _fresh()
    stamps, tokens = [], []
    t0 = time.perf_counter()
    kw = dict(max_tokens=gen, prefill_step_size=step, **(kv or {}), **(extra or {}))
    for r in stream_fn(model if model is not None else bm.model, bm.tokenizer, prompt, **kw):
        stamps.append(time.perf_counter())
        tokens.append(int(r.token))
    peak = mx.get_peak_memory()
    ttft = stamps[0] - t0
    # Per-step times: their low percentiles show the step cost when the host does not stall.
    itl = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)] or [0.0]
    return {
        "ttft_s": ttft,
        "prefill_tok_s": prompt.size / ttft,
        "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
        "itl_p50_ms": percentile(itl, 50),
        "itl_p10_ms": percentile(itl, 10),
        "peak_memory_gb": peak / 1e9,
        "generated": len(tokens),
        "reported_prompt_tps": r.prompt_tps,  # what each side's own response object says
        "reported_generation_tps": r.generation_tps,
        "tokens": tokens,
        "token_times_ms": [round(1e3 * (t - t0), 3) for t in stamps],
    }


AB = ("mlx_lm", "mlxd")


def _interleave(
    pair: Callable[[tuple[str, str]], dict[str, Any]], args: Any, rounds: int, what: str
) -> dict[str, Any]:
    """Untimed warm-up pairs, then timed rounds A B A B (or A B, B A, ... with --order
    alternate, so that neither side always runs right after the other)."""
    warm = [pair(AB) for _ in range(args.warmup)]
    timed = []
    with tqdm(total=rounds, desc=what, file=sys.stderr, disable=None) as bar:
        for i in range(rounds):
            order = AB[::-1] if args.order == "alternate" and i % 2 else AB
            timed.append(rec := pair(order))
            a, b = rec["mlx_lm"]["decode_tok_s"], rec["mlxd"]["decode_tok_s"]
            bar.write(f"[{what}] round {i}: decode tok/s mlx-lm {a:.1f}, mlxd {b:.1f}", sys.stderr)
            bar.update()
    return {"warmup": warm, "rounds": timed, **consistency(warm + timed)}


def bench_single(bm: BenchModel, args: Any) -> dict[str, Any]:
    prompt = mx.array(random_prompts(bm.vocab_size, 1, args.prompt_tokens, args.seed)[0])
    sides = {"mlx_lm": mlx_lm_stream_generate, "mlxd": mlxd_stream_generate}
    kv = kv_flags(args)
    own = with_adapter(bm, args.adapter_path)

    def pair(order: tuple[str, str]) -> dict[str, dict[str, Any]]:
        runs = {
            s: single_run(
                sides[s],
                bm,
                prompt,
                args.gen_tokens,
                args.prefill_step_size,
                kv,
                *own.get(s, (None, None)),
            )  # fmt: skip
            for s in order
        }
        return {"order": list(order), **runs}

    out = _interleave(pair, args, args.rounds, "single")
    # The paths mlxd's requests took (a lone stream on the main thread is "driven": driver.py).
    paths = engine_for(bm.model).stats()["paths"]
    return out | {"summary": summarize(out["rounds"], SINGLE_METRICS), "engine_paths": paths}


def with_adapter(bm: BenchModel, path: str | None) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Each side's (model, extra arguments) with the adapter at `path`: mlx-lm's side a copy
    of the model with mlx-lm's LoRA layers (load_adapters); mlxd's the base model, the adapter
    loaded into its engine and named by the request (what --lora-modules serves)."""
    if path is None:
        return {}
    import copy

    from mlx_lm.tuner.utils import load_adapters

    ref = load_adapters(copy.deepcopy(bm.model), path)
    ref.eval()
    engine = engine_for(bm.model)
    if "bench" not in engine.adapter_names():
        engine.load_adapter("bench", path)
    return {"mlx_lm": (ref, {}), "mlxd": (bm.model, {"adapter": "bench"})}


def bench_concurrent(bm: BenchModel, args: Any) -> dict[str, Any]:
    n, gen, step = args.concurrent, args.gen_tokens, args.prefill_step_size
    lists = random_prompts(bm.vocab_size, n, args.prompt_tokens, args.seed + 1)
    arrays = [mx.array(p) for p in lists]
    # Capacity n on both sides: the same batch composition, so the same tokens.
    attention = getattr(args, "batched_attention", "mlx")
    decode_step = getattr(args, "decode_step", "rows")
    rows, fused = decode_step != "mlx", decode_step == "rows+fused"
    config = EngineConfig(
        n, min(n, 8), step, attention=attention, decode_rows=rows, decode_fused=fused
    )
    engine = Engine(bm.model, config)
    # The highest K ids (never EOS of a real vocab's low ids), banned on every stream.
    k = getattr(args, "ban_tokens", 0)
    bias = {bm.vocab_size - 1 - i: -100.0 for i in range(k)} or None
    kv = kv_flags(args)
    if kv is not None and bias is not None:
        raise SystemExit("mlxd bench generate: --kv-bits with --ban-tokens is not measured")

    def pair(order: tuple[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {"order": list(order)}
        for side in order:
            _fresh()
            if side == "mlx_lm" and kv is not None:
                t0, stamps, tokens = concurrent.run_mlx_lm_serial(bm.model, lists, gen, step, kv)
            elif side == "mlx_lm":
                t0, stamps, tokens = concurrent.run_mlx_lm(bm.model, lists, gen, n, step, bias)
            else:
                t0, stamps, tokens = concurrent.run_mlxd(engine, arrays, gen, bias, kv)
            out[side] = concurrent.metrics(t0, stamps, mx.get_peak_memory()) | {"tokens": tokens}
        return out

    try:
        out = _interleave(pair, args, args.concurrent_rounds, "concurrent")
    finally:
        engine.close()
    summary = summarize(out["rounds"], CONCURRENT_METRICS)
    paths = dict(engine.paths)
    scheme = {"kv": kv} if kv is not None else {}
    return {
        "streams": n,
        "banned_tokens": k,
        "batched_attention": attention,
        "decode_step": decode_step,
        **scheme,
        **out,
        "summary": summary,
        "engine_paths": paths,
    }


def environment() -> dict[str, Any]:
    import mlx_lm

    from .. import __version__

    env = {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "mlxd": __version__,
        "device": str(mx.default_device()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:  # the GPU's name on CUDA / Metal; absent on some builds
        info = mx.device_info()
        env["device_info"] = {k: v for k, v in info.items() if isinstance(v, str | int | float)}
        if name := info.get("device_name"):
            env["device"] += f" ({name})"
    except Exception:  # noqa: BLE001 - informative only
        pass
    return env


def run_bench(args: Any) -> int:
    """Build or load the model, run the modes asked for, print the table; 1 on a token mismatch
    (not when mlx-lm itself is nondeterministic on this backend: then no bitwise check exists)."""
    if args.random_shape:
        bm = build_random(args.random_shape, args.dtype or "bfloat16", args.seed)
    else:
        bm = load_ref(args.model, args.dtype)
    result: dict[str, Any] = {
        "env": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "model": {
            "name": bm.name,
            "source": "random weights" if args.random_shape else "loaded",
            "dtype": bm.dtype,
            "param_bytes": bm.param_bytes,
            "vocab_size": bm.vocab_size,
        },
    }

    def save() -> None:  # after every part, so a run killed at a time limit keeps what it did
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=str))

    if args.rounds > 0:
        result["single"] = bench_single(bm, args)
        save()
    if args.concurrent:
        result["concurrent"] = bench_concurrent(bm, args)
        save()
    print(render(result), flush=True)
    parts = [result[k] for k in ("single", "concurrent") if k in result]
    # Folded attention is opt-in because it changes bits: its mismatch is the expected result.
    parts = [p for p in parts if p.get("batched_attention", "mlx") == "mlx"]
    if any(p["verdict"] == "MISMATCH" for p in parts):
        print("mlxd bench: mlxd generated other tokens than mlx-lm", file=sys.stderr)
        return 1
    return 0
