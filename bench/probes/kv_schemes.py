"""KV schemes side by side: decode tok/s and peak memory for bf16 / 8-bit / 4-bit /
mixed at B = 1 and B = N, and the longest context a fixed KV budget holds under each scheme.

    python -m bench.probes.kv_schemes --shape qwen3-0.6b --prompt-tokens 2048 --gen-tokens 128

The peer side is what mlx-lm ships for each scheme: `generate_step` with the same flags at
B = 1; at B = N, BatchGenerator for bf16 and one stream after another for quantized KV (as
mlx_lm.server runs `--kv-bits`). mlx-lm has no mixed per-layer KV: that row is mlxd only.
Quantization starts at token 0 (`--quantized-kv-start`), so every token past the first
prefill chunk is read from quantized KV. Tokens are compared where both sides ran.
"""

import argparse
import gc
import json
import sys
from typing import Any

import mlx.core as mx

from mlxd.bench import concurrent
from mlxd.bench.models import build_random, random_prompts
from mlxd.engine.admission import KVCost
from mlxd.engine.engine import Engine
from mlxd.kv import mixed


def _fresh() -> None:
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()


def schemes(n_layers: int, start: int) -> dict[str, dict[str, Any]]:
    """Request flags per scheme; `mixed`: 8-bit on the first and last quarter of the layers
    (the sensitive ones in mlx-optiq's reports), 4-bit between."""
    q = max(1, n_layers // 4)
    layers = [
        {"layer_idx": i, "bits": 8 if i < q or i >= n_layers - q else 4, "group_size": 64}
        for i in range(n_layers)
    ]
    return {
        "bf16": {},
        "8bit": dict(kv_bits=8, kv_group_size=64, quantized_kv_start=start),
        "4bit": dict(kv_bits=4, kv_group_size=64, quantized_kv_start=start),
        "mixed": dict(kv_config=mixed.parse(layers), quantized_kv_start=start),
    }


def _peer(model: Any, prompts: list[list[int]], gen: int, step: int, kv: dict) -> tuple:
    if "kv_config" in kv:
        return None
    if len(prompts) > 1 and not kv:
        return concurrent.run_mlx_lm(model, prompts, gen, len(prompts), step)
    return concurrent.run_mlx_lm_serial(model, prompts, gen, step, kv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    bm = build_random(args.shape, args.dtype, seed=args.seed)
    cost = KVCost.probe(bm.model)
    n_layers = len(bm.model.layers)
    out: dict[str, Any] = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": str(mx.default_device()),
    }
    out |= {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "runs": []}
    budget = int(args.budget_gb * 1e9)
    for name, kv in schemes(n_layers, args.quantized_kv_start).items():
        if "kv_config" in kv:
            per_token = mixed.token_bytes(kv["kv_config"], cost.per_layer, cost.itemsize)
        else:
            per_token = cost.token_bytes(kv.get("kv_bits"), kv.get("kv_group_size", 64))
        out.setdefault("bytes_per_token", {})[name] = per_token
        out.setdefault("context_in_budget", {})[name] = int(budget // per_token)
        for b in args.batch:
            lists = random_prompts(bm.vocab_size, b, args.prompt_tokens, args.seed + b)
            run: dict[str, Any] = {"scheme": name, "batch": b}
            engine = Engine(bm.model, batch=max(b, 1), prefill_step_size=args.prefill_step_size)
            try:  # a backend without a kernel for a scheme fails that run, not the bench
                for _ in range(args.warmup):
                    concurrent.run_mlxd(engine, [mx.array(p) for p in lists[:1]], 4, None, kv)
                _fresh()
                t0, stamps, ours = concurrent.run_mlxd(
                    engine, [mx.array(p) for p in lists], args.gen_tokens, None, kv
                )
                run["mlxd"] = _summary(concurrent.metrics(t0, stamps, mx.get_peak_memory()))
                run["paths"] = dict(engine.paths)
            except Exception as e:  # noqa: BLE001 - recorded in the report
                run["mlxd_error"], ours = str(e)[:300], None
            finally:
                engine.close()
            _fresh()
            try:
                peer = _peer(bm.model, lists, args.gen_tokens, args.prefill_step_size, kv)
            except Exception as e:  # noqa: BLE001 - recorded in the report
                run["mlx_lm_error"], peer = str(e)[:300], None
            if peer is not None:
                t0, stamps, theirs = peer
                run["mlx_lm"] = _summary(concurrent.metrics(t0, stamps, mx.get_peak_memory()))
                run["same_tokens"] = theirs == ours
                if "mlxd" in run:
                    ratio = run["mlxd"]["decode_tok_s"] / run["mlx_lm"]["decode_tok_s"]
                    run["decode_ratio"] = ratio
            out["runs"].append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    return out


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    keep = ("decode_tok_s", "e2e_tok_s", "ttft_p50_s", "itl_p50_ms", "peak_memory_gb")
    return {k: round(m[k], 4) for k in keep}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.kv_schemes", description=__doc__)
    p.add_argument("--shape", default="qwen3-host")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--quantized-kv-start", type=int, default=0)
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--budget-gb", type=float, default=8.0, help="KV budget for the context column")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the whole result here")
    args = p.parse_args(argv)
    result = measure(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(render(result))


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['shape']} {r['dtype']} on {r['device']}: prompt {r['prompt_tokens']}, "
             f"{r['gen_tokens']} generated per stream"]  # fmt: skip
    lines.append("| scheme | B | mlxd decode tok/s | mlx-lm decode tok/s | ratio | mlxd peak GB | "
                 "mlx-lm peak GB | same tokens |")  # fmt: skip
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in r["runs"]:
        ours, theirs = run.get("mlxd"), run.get("mlx_lm")
        if ours is None:
            error = run["mlxd_error"].splitlines()[0]
            lines.append(f"| {run['scheme']} | {run['batch']} | failed: {error} | | | | | |")
            continue
        peer, peak = "n/a (mlx-lm has no mixed KV) | -", "-"
        if theirs:
            peer = f"{theirs['decode_tok_s']:.1f} | {run['decode_ratio']:.2f}x"
            peak = f"{theirs['peak_memory_gb']:.2f}"
        lines.append(
            f"| {run['scheme']} | {run['batch']} | {ours['decode_tok_s']:.1f} | {peer} | "
            f"{ours['peak_memory_gb']:.2f} | {peak} | {run.get('same_tokens', '-')} |"
        )
    lines.append("")
    lines.append("| scheme | KV bytes per token | context in the budget |")
    lines.append("| --- | --- | --- |")
    for name, per in r["bytes_per_token"].items():
        lines.append(f"| {name} | {per:.0f} | {r['context_in_budget'][name]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
