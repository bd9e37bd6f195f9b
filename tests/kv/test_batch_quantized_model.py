"""BatchQuantizedKVCache under a real model (tiny random qwen3 / llama): rows merged from their
solo quantized caches decode, in one batch, the same greedy tokens and logits as each row alone
on mlx-lm's QuantizedKVCache, padded rows included (CPU: masked columns add exact zeros), and
after a row leaves (filter). The engine batches quantized-KV rows on it (one batch per KV
format, engine/rows.py)."""

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from mlxd.kv.batch_quantized import BatchQuantizedKVCache

TEXTS = ["Hello there my friend, how are you today?", "x y", "Tell me a story"]


def _prefilled(model, prompt: list[int], bits: int, group: int) -> list:
    """generate_step's order with quantized_kv_start=0: prefill all but the last token, then
    the caches turn quantized (maybe_quantize_kv_cache)."""
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    return [c.to_quantized(group_size=group, bits=bits) for c in cache]


def _greedy(model, tokens: mx.array, cache: list, steps: int) -> tuple[list, list]:
    ids, logits = [], []
    for _ in range(steps):
        out = model(tokens, cache=cache)[:, -1, :]
        tokens = mx.argmax(out, axis=-1, keepdims=True)
        ids.append(tokens[:, 0].tolist())
        logits.append(out)
    return ids, logits


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("bits,group", [(8, 64), (4, 32)])
def test_a_quantized_batch_decodes_each_row_s_solo_bits(
    tiny_model: Callable[..., Path], arch: str, bits: int, group: int
) -> None:
    model, tok = load(str(tiny_model(arch)))
    prompts = [tok.encode(t) for t in TEXTS]
    last = [p[-1] for p in prompts]
    solo = [
        _greedy(model, mx.array([[t]]), _prefilled(model, p, bits, group), 6)
        for p, t in zip(prompts, last, strict=True)
    ]
    rows = [_prefilled(model, p, bits, group) for p in prompts]
    batch = [BatchQuantizedKVCache.merge([r[i] for r in rows]) for i in range(len(rows[0]))]
    assert min(batch[0].left_padding.tolist()) == 0 < max(batch[0].left_padding.tolist())
    ids, logits = _greedy(model, mx.array([[t] for t in last]), batch, 3)
    for r, (solo_ids, solo_logits) in enumerate(solo):
        assert [step[r] for step in ids] == [s[0] for s in solo_ids[:3]]
        for step in range(3):
            assert mx.array_equal(logits[step][r], solo_logits[step][0]).item()
    # Row 1 leaves; the others go on with their own next tokens and still match.
    for c in batch:
        c.filter([0, 2])
    nxt = mx.array([[ids[-1][0]], [ids[-1][2]]])
    ids2, logits2 = _greedy(model, nxt, batch, 3)
    for j, r in enumerate((0, 2)):
        assert [step[j] for step in ids2] == [s[0] for s in solo[r][0][3:6]]
        for step in range(3):
            assert mx.array_equal(logits2[step][j], solo[r][1][3 + step][0]).item()
