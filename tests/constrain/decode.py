"""A batched decode loop under grammar masks, driven the way the engine will drive it: a tiny
random-weight model, temperature-1 sampling from the masked logits with a fixed key, one
`BatchMasker` for the batch, rows finishing on EOS (`stop`) or at max_tokens (`length`).

Random weights give near-random logits, the adversarial case: every output comes from the
masked model distribution, nothing steers it toward closing the JSON.
"""

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxd.constrain import BatchMasker, GrammarCompiler, Matcher


@dataclass
class Row:
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None  # "stop" (EOS sampled) or "length"
    eos_checks: int = 0  # steps at which the mask was checked for EOS


def _filter(cache: list[Any], keep: list[int]) -> None:
    """Drop finished rows from plain KVCaches (batch is the first axis)."""
    idx = mx.array(keep)
    for c in cache:
        c.keys, c.values = c.keys[idx], c.values[idx]


def decode(
    model: Any,
    compiler: GrammarCompiler,
    matchers: list[Matcher | None],
    prompt: list[int],
    *,
    max_tokens: int,
    seed: int = 0,
) -> list[Row]:
    """Decode one row per matcher (None: unconstrained) from the same prompt."""
    eos = set(compiler.eos_token_ids)
    masker = BatchMasker(compiler.vocab)
    rows = [Row() for _ in matchers]
    live = list(range(len(matchers)))
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt] * len(live)), cache=cache)[:, -1]
    key = mx.random.key(seed)
    try:
        for _ in range(max_tokens):
            ms = [matchers[i] for i in live]
            mask = masker.fill(ms)
            for j, m in enumerate(ms):
                if m is not None:
                    # EOS only where the output is complete.
                    eos_allowed = any(_bit(mask[j], t) for t in eos)
                    assert eos_allowed == m.is_accepting(), (live[j], eos_allowed)
                    rows[live[j]].eos_checks += 1
            masked = masker.apply(logits, mask, ms)
            key, sub = mx.random.split(key)
            sampled = mx.random.categorical(masked, key=sub).tolist()
            keep = []
            for j, (i, t) in enumerate(zip(live, sampled, strict=True)):
                if t in eos:
                    rows[i].finish = "stop"
                    continue
                m = matchers[i]
                assert m is None or m.accept(t), m.error
                rows[i].tokens.append(t)
                keep.append(j)
            if not keep:
                break
            if len(keep) < len(live):
                _filter(cache, keep)
                live = [live[j] for j in keep]
                sampled = [sampled[j] for j in keep]
            logits = model(mx.array(sampled)[:, None], cache=cache)[:, -1]
    finally:
        masker.close()
    for r in rows:
        r.finish = r.finish or "length"
    return rows


def _bit(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)
