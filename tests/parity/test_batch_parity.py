"""mlxd.batch_generate against mlx_lm.batch_generate on four architectures.

Three prompts of different lengths (5, 40 and 17 tokens) and different max_tokens go through
both; texts, token ids and per-token logprobs (return_token_ids / return_logprobs, both in
mlx-lm 0.32.2's signature) must be identical, and so must the caller's PRNG key afterwards.
The architectures cover a plain KV cache (llama), sliding-window rotating caches (gemma3),
recurrent conv state with attention (lfm2) and MoE routing plus max_kv_size (qwen3_moe, which
has no make_cache, so max_kv_size gives it rotating caches).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import mlx_lm
import numpy as np
import pytest
from fixtures.tiny_models import EOS_ID
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from parity.helpers import PROMPT_TEXT, BatchRun, assert_same_batch, run_batch

import mlxd

BATCH_ARCHS = ("llama", "gemma3", "lfm2", "qwen3_moe")
MAX_TOKENS = [10, 14, 12]


def batch_prompts(tokenizer) -> list[list[int]]:
    ids = tokenizer.encode(PROMPT_TEXT)
    return [ids[0:5], ids[3:43], ids[20:37]]


@dataclass(frozen=True)
class BatchCase:
    id: str
    seed: int | None = None
    sampler: dict[str, Any] | None = None
    processors: dict[str, Any] | None = None
    gen: dict[str, Any] = field(default_factory=dict)
    returns: bool = True  # return_token_ids and return_logprobs
    archs: tuple[str, ...] = BATCH_ARCHS

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = copy.deepcopy(self.gen)
        kw["max_tokens"] = list(MAX_TOKENS)
        kw["return_token_ids"] = kw["return_logprobs"] = self.returns
        if self.sampler is not None:
            kw["sampler"] = make_sampler(**copy.deepcopy(self.sampler))
        if self.processors is not None:
            kw["logits_processors"] = make_logits_processors(**copy.deepcopy(self.processors))
        return kw


BATCH_CASES = [
    BatchCase("greedy_prefill8", gen=dict(prefill_step_size=8)),
    # Two prompts prefilled together, the third joins the running batch later: merging and
    # extending rotating (gemma3) and recurrent (lfm2) batch caches.
    BatchCase(
        "greedy_prefill_batch2",
        gen=dict(prefill_step_size=16, prefill_batch_size=2, completion_batch_size=2),
        archs=("gemma3", "lfm2"),
    ),
    BatchCase(
        "sampled",
        seed=41,
        sampler=dict(temp=0.9, top_p=0.9, min_p=0.02, top_k=64),
        gen=dict(prefill_step_size=8),
    ),
    BatchCase(
        "processors",
        processors=dict(
            logit_bias={EOS_ID: -100.0, 1000: 6.0, 2000: 6.0},
            repetition_penalty=1.3,
            presence_penalty=0.4,
            frequency_penalty=0.2,
        ),
        gen=dict(prefill_step_size=16),
        archs=("llama", "lfm2"),
    ),
    # Only models without make_cache honour max_kv_size (BatchRotatingKVCache).
    BatchCase("max_kv_24", gen=dict(max_kv_size=24, prefill_step_size=8), archs=("qwen3_moe",)),
    BatchCase("texts_only", returns=False, archs=("llama",)),
]


@pytest.mark.parametrize(
    "arch,case",
    [
        pytest.param(a, c, id=f"{a}-{c.id}")
        for a in BATCH_ARCHS
        for c in BATCH_CASES
        if a in c.archs
    ],
)
def test_batch_generate_parity(loaded_pair, arch: str, case: BatchCase) -> None:
    pair = loaded_pair(arch)
    prompts = batch_prompts(pair.ref_tok)
    assert [len(p) for p in prompts] == [5, 40, 17]
    ref = run_batch(
        mlx_lm.batch_generate,
        pair.ref_model,
        pair.ref_tok,
        prompts,
        seed=case.seed,
        **case.kwargs(),
    )
    got = run_batch(
        mlxd.batch_generate,
        pair.got_model,
        pair.got_tok,
        prompts,
        seed=case.seed,
        **case.kwargs(),
    )
    assert ref.error is None, f"mlx-lm failed: {ref.error!r}"
    if case.returns:
        assert [len(t) for t in ref.response.token_ids] == MAX_TOKENS
        assert [len(lp) for lp in ref.response.logprobs] == MAX_TOKENS
    else:
        assert ref.response.token_ids is None and ref.response.logprobs is None
    assert all(ref.response.texts)
    assert_same_batch(ref, got, f"{arch}/{case.id}")


def test_sanity_batch_difference_is_caught(loaded_pair) -> None:
    pair = loaded_pair("llama")
    prompts = batch_prompts(pair.ref_tok)

    def run(seed: int) -> BatchRun:
        return run_batch(
            mlx_lm.batch_generate,
            pair.ref_model,
            pair.ref_tok,
            prompts,
            seed=seed,
            max_tokens=6,
            return_token_ids=True,
            return_logprobs=True,
            sampler=make_sampler(temp=1.0),
        )

    a, a2, b = run(1), run(1), run(2)
    assert_same_batch(a, a2)
    with pytest.raises(AssertionError):
        assert_same_batch(a, b)
    # A single logprob off by one ulp in the last place of its float64 value.
    c = copy.deepcopy(a2)
    c.response.logprobs[1][3] = float(np.nextafter(c.response.logprobs[1][3], 0.0))
    with pytest.raises(AssertionError, match="logprobs of sequence 1"):
        assert_same_batch(a, c)
