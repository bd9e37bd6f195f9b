"""mlx-lm's `generate_step` alone on a fleet agent's first turn: the bound that a lone agent's
inter-token latency through a server is measured against (the target: mlxd serve's ITL <=
1.05x generate_step's on the same machine).

    python -m mlxd.bench.raw_step --model M --prompt-tokens 3630 --gen-tokens 256 --rounds 3

A random prompt of `--prompt-tokens` ids (seeded), greedy, `--gen-tokens` tokens; the ITL is
the gap between tokens as the caller receives them, pooled over rounds after one of warm-up,
as `mlxd bench serve` pools the gaps between streamed chunks. Prints one JSON line.
`--engine` alternates mlxd's own Python API (its engine, no server) with it round by round on
the same prompts, so the server's cost over the engine is read on one machine (`engine` key).
`mlxd bench serve --baseline` runs this in its own process before each one-agent round.
"""

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterable

import mlx.core as mx


def _gaps_ms(stream: Iterable[object]) -> list[float]:
    """Milliseconds between consecutive items as the caller receives them."""
    stamps = [time.perf_counter() for _ in stream]
    return [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]


def run(
    model_path: str, prompt_tokens: int, gen_tokens: int, rounds: int, engine: bool = False
) -> dict:
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(model_path)
    sides: dict[str, Callable[[mx.array], Iterable[object]]] = {
        "generate_step": lambda p: generate_step(p, model, max_tokens=gen_tokens)
    }
    if engine:
        from ..engine import stream_generate  # mlxd's, on its engine (the caller drives it)

        sides["engine"] = lambda p: stream_generate(model, tok, p, max_tokens=gen_tokens)
    rng = random.Random(0)
    vocab = getattr(getattr(model, "args", None), "vocab_size", None) or len(tok.vocab)
    gaps: dict[str, list[float]] = {name: [] for name in sides}
    per_round: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds + 1):  # round 0 warms up (kernels, allocator)
        prompt = mx.array([rng.randrange(1, vocab) for _ in range(prompt_tokens)])
        order = list(sides) if r % 2 == 0 else list(reversed(sides))  # neither always first
        for name in order:
            mine = _gaps_ms(sides[name](prompt))
            if r > 0:
                gaps[name] += mine
                per_round[name].append(statistics.median(mine))
            mx.clear_cache()
    out = _figures(gaps["generate_step"], per_round["generate_step"])
    out |= {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "rounds": rounds}
    if engine:
        out["engine"] = _figures(gaps["engine"], per_round["engine"])
    return out


def _figures(gaps: list[float], per_round: list[float]) -> dict:
    return {
        "itl_p50_ms": statistics.median(gaps),
        "itl_p10_ms": statistics.quantiles(gaps, n=10)[0],
        "round_p50_ms": per_round,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=int, default=3630)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engine", action="store_true", help="also mlxd's engine, alternated")
    a = p.parse_args(argv)
    print(json.dumps(run(a.model, a.prompt_tokens, a.gen_tokens, a.rounds, a.engine)), flush=True)


if __name__ == "__main__":
    main()
