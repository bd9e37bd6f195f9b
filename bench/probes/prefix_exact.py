"""Does a prefix-store hit give the bits of a miss? A GPU check (on CPU the kernels happen to be
chunk-invariant, so both modes agree there).

For each mode (default, and --prefix-deterministic's grid), a fresh engine answers prompt B
cold (a miss); another engine first answers prompt A, which shares a long prefix with B, then
answers B from the store (a hit). Reports whether tokens and logprob vectors are identical.

    python -m bench.probes.prefix_exact --model DIR [--shared 3000] [--step 512] [--json OUT]
"""

import argparse
import json
from typing import Any

import mlx.core as mx

from mlxd.engine import Engine, GenerationRequest
from mlxd.model import load
from mlxd.store import PrefixStore


def _run(engine: Engine, prompt: list[int], tokens: int, step: int) -> tuple[list, list, int]:
    req = GenerationRequest(prompt=mx.array(prompt), max_tokens=tokens, prefill_step_size=step)
    h = engine.submit(req)
    events = list(h)
    return [e.token for e in events], [e.logprobs for e in events], h.done.cached_tokens


def compare(model: Any, shared: int, suffix: int, tokens: int, step: int, grid: int) -> dict:
    key = mx.random.key(7)
    words = mx.random.randint(1000, 20000, (shared + 2 * suffix,), key=key).tolist()
    a = words[:shared] + words[shared : shared + suffix]
    b = words[:shared] + words[shared + suffix :]

    def engine() -> Engine:
        store = PrefixStore(grid=grid)
        return Engine(model, batch=1, prefill_step_size=step, prefix_store=store, namespace="x")

    cold, warm = engine(), engine()
    try:
        miss = _run(cold, b, tokens, step)
        _run(warm, a, tokens, step)
        hit = _run(warm, b, tokens, step)
    finally:
        cold.close()
        warm.close()
    equal = [bool(mx.array_equal(x, y).item()) for x, y in zip(miss[1], hit[1], strict=True)]
    diff = max(float(mx.abs(x - y).max().item()) for x, y in zip(miss[1], hit[1], strict=True))
    return {
        "mode": "deterministic" if grid else "default",
        "cached_tokens": hit[2],
        "same_tokens": miss[0] == hit[0],
        "identical_logprob_vectors": sum(equal),
        "of": len(equal),
        "max_abs_logprob_diff": diff,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--shared", type=int, default=3000, help="shared prefix tokens")
    p.add_argument("--suffix", type=int, default=300, help="tokens after the shared prefix")
    p.add_argument("--tokens", type=int, default=32, help="generated tokens compared")
    p.add_argument("--step", type=int, default=512, help="--prefill-step-size")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model = load(args.model)[0]
    rows = [
        compare(model, args.shared, args.suffix, args.tokens, args.step, grid)
        for grid in (0, args.step)
    ]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "device": str(mx.default_device()), "rows": rows}, f)


if __name__ == "__main__":
    main()
