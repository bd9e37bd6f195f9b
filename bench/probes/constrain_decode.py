"""Per-token cost of constrained decoding in the engine: the same prompts
decoded free and under a grammar, at B = 1 and B = N, on a random-weight model with the Qwen3
tokenizer's vocabulary; the difference in time per step is the grammar's cost.

    python -m bench.probes.constrain_decode --shape qwen3-0.6b --tokenizer DIR --batch 1 8

Greedy decoding; EOS is banned on every row (the same logit bias on both sides; only the mask
differs), so every row makes exactly --gen-tokens tokens, a regex of lowercase words.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxd.bench import concurrent
from mlxd.bench.models import build_random, random_prompts
from mlxd.constrain import Constraint, compiler_for
from mlxd.constrain.processor import GrammarLogitsProcessor
from mlxd.engine.decode_step import LogitBias
from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest

NEVER_DONE = Constraint.regex(r"[a-z][a-z ]*")  # lowercase words; EOS is banned on both sides


def _requests(prompts: list[list[int]], gen: int, grammar: Any, ban: dict[int, float]) -> list:
    out = []
    for p in prompts:
        procs = [LogitBias(ban)]  # the same scatter on both sides: only the mask differs
        if grammar is not None:
            procs.append(GrammarLogitsProcessor(grammar.matcher(NEVER_DONE)))
        out.append(GenerationRequest(prompt=mx.array(p), max_tokens=gen, logits_processors=procs))
    return out


def run(engine: Engine, reqs: list[GenerationRequest]) -> dict[str, Any]:
    t0 = time.perf_counter()
    handles = engine.submit_many(reqs)
    stamps = [[time.perf_counter() for _ in h] for h in handles]
    return concurrent.metrics(t0, stamps, mx.get_peak_memory())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.constrain_decode", description=__doc__)
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer folder")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    bm = build_random(args.shape, args.dtype)
    tok = load_tokenizer(Path(args.tokenizer))
    if bm.vocab_size < len(tok):  # prompt ids and the EOS ban must exist in the model
        raise SystemExit(f"{args.shape} has {bm.vocab_size} ids, the tokenizer {len(tok)}")
    tic = time.perf_counter()
    compiler = compiler_for(tok)
    result: dict[str, Any] = {"shape": args.shape, "device": str(mx.default_device())}
    result["tokenizer_table_s"] = time.perf_counter() - tic
    tic = time.perf_counter()
    compiler.compile(NEVER_DONE)
    result["compile_cold_ms"] = 1e3 * (time.perf_counter() - tic)
    ban = {t: -1e9 for t in tok.eos_token_ids}
    result["runs"] = []
    for b in args.batch:
        prompts = random_prompts(len(tok), b, args.prompt_tokens, seed=b)
        engine = Engine(bm.model, batch=b)
        try:
            run(engine, _requests(prompts, 8, compiler, ban))  # warm-up: compile, first masks
            for r in range(args.rounds):
                row: dict[str, Any] = {"batch": b, "round": r}
                for side, grammar in (("free", None), ("grammar", compiler)):
                    m = run(engine, _requests(prompts, args.gen_tokens, grammar, ban))
                    row[side] = {k: m[k] for k in ("decode_tok_s", "itl_p50_ms", "itl_p99_ms")}
                per_step = (
                    1e3 * b / row["free"]["decode_tok_s"],
                    1e3 * b / row["grammar"]["decode_tok_s"],
                )
                row["step_ms"] = {"free": per_step[0], "grammar": per_step[1]}
                row["overhead_ms_per_step"] = per_step[1] - per_step[0]
                result["runs"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            engine.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    for row in result["runs"]:
        s, extra = row["step_ms"], row["overhead_ms_per_step"]
        print(f"B={row['batch']} round {row['round']}: step {s['free']:.2f} ms free, "
              f"{s['grammar']:.2f} ms constrained (+{extra:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
