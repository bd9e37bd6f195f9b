"""The server's prompt building for an agent fleet: N requests sharing a long system prompt
turned into tokens at once (the chat template, the tokenizer, the system cut), as the server
does it on its worker threads, with the system tokens' cache (serve/system_tokens.py) on and off.

    python -m mlxd.bench.probe_prompt --tokenizer DIR --agents 32 --system-tokens 3600

Prints per side the median ms for one request alone and for all N together (alternated rounds);
the N together bound how spread out the agents reach the engine. docs/performance.md §1.
"""

import argparse
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..serve.prompt import chat_prompt
from ..serve.system_tokens import SYSTEM_TOKENS
from .fleet import text_of_tokens, words


def conversations(tokenizer: Any, agents: int, system_tokens: int) -> list[list[dict]]:
    """The fleet bench's second turn: a shared system prompt, a task, a reply, a follow-up."""
    rng = random.Random(0)
    system = text_of_tokens(tokenizer, rng, system_tokens)
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"You are agent {i}. {' '.join(words(rng, 24))}"},
            {"role": "assistant", "content": " ".join(words(rng, 200))},
            {"role": "user", "content": f"Turn 2: go on with {' '.join(words(rng, 12))}"},
        ]
        for i in range(agents)
    ]


def _timed(tokenizer: Any, convs: list[list[dict]], pool: ThreadPoolExecutor) -> tuple:
    """(ms for the first request alone, ms for all of them submitted together)."""
    tic = time.perf_counter()
    chat_prompt(tokenizer, convs[0], None, {})
    alone = time.perf_counter() - tic
    tic = time.perf_counter()
    list(pool.map(lambda m: chat_prompt(tokenizer, m, None, {}), convs))
    return 1e3 * alone, 1e3 * (time.perf_counter() - tic)


def run(tokenizer: Any, agents: int, system_tokens: int, rounds: int) -> list[str]:
    convs = conversations(tokenizer, agents, system_tokens)
    size, out = SYSTEM_TOKENS.size, {"cache on": [], "cache off": []}
    try:
        with ThreadPoolExecutor(max_workers=min(32, agents)) as pool:
            for r in range(rounds + 1):  # round 0 warms both sides up
                for side in list(out)[:: 1 if r % 2 == 0 else -1]:
                    SYSTEM_TOKENS.size = size if side == "cache on" else 0
                    chat_prompt(tokenizer, convs[0], None, {})  # the cache as a fleet finds it
                    timed = _timed(tokenizer, convs, pool)
                    if r:
                        out[side].append(timed)
    finally:
        SYSTEM_TOKENS.size = size
    n = len(chat_prompt(tokenizer, convs[0], None, {}).tokens)
    lines = [f"{agents} agents, {n}-token prompts, {rounds} rounds (median [min-max])"]
    for side, v in out.items():
        one, all_ = [a for a, _ in v], [b for _, b in v]
        lines.append(
            f"{side}: one request {statistics.median(one):.2f} ms, all {agents} together "
            f"{statistics.median(all_):.1f} ms [{min(all_):.1f}-{max(all_):.1f}]"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="a model or tokenizer folder")
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=3600)
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args(argv)
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(Path(a.tokenizer))
    print("\n".join(run(tokenizer, a.agents, a.system_tokens, a.rounds)), flush=True)


if __name__ == "__main__":
    main()
