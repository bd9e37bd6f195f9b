"""Sampled output keeps its distribution under speculation (sample-and-match): over seeded rows
at temperature 1 (top-k 2, so each position has two outcomes) with a prediction to draft from,
how often each position repeats the prediction's token, and the first token's distribution,
are the model's own top-2 probabilities (one-sample tests at four standard errors). A verify
step that kept drafts the target did not sample would repeat the prediction far more often."""

import math
from collections import Counter

import mlx.core as mx
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest, Speculation
from mlxd.engine.sampling import SamplingParams

# Held to exact probabilities (no second sample's noise), 100 rows of 7 tokens put an
# accept-every-draft verifier about 7 standard errors out at the last positions.
N, LENGTH, TOP_K = 100, 7, 2


@pytest.fixture(autouse=True)
def free_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step with drafts verifies them (no timing-dependent gate)."""
    from mlxd.engine.speculate.gate import StepCosts

    monkeypatch.setattr(StepCosts, "ratio", lambda self, rows, width: 1.0)


def _samples(
    model, prompt: list[int], seeds: range, spec: Speculation | None, temp: float = 1.0
) -> list[list[int]]:
    """Each seeded row's tokens (and, for drafting rows, that they verified drafts)."""
    sampling = SamplingParams(temp=temp, top_k=TOP_K)
    reqs = [GenerationRequest(prompt=mx.array(prompt), max_tokens=LENGTH, sampling=sampling,
                              seed=s, speculation=spec) for s in seeds]  # fmt: skip
    engine = Engine(model)
    try:
        handles = engine.submit_many(reqs)
        out = [[e.token for e in h] for h in handles]
        if spec is not None:
            assert sum(h.done.drafted_tokens for h in handles) > len(handles)
        return out
    finally:
        engine.close()


def _top2(model, prompt: list[int], prediction: list[int]) -> list[dict[int, float]]:
    """Each position's two sampleable tokens and their probabilities on the prediction's path:
    mlx-lm's forward, the top two logits renormalized (what top-k 2 at temperature 1 draws)."""
    x = mx.array([prompt + prediction[:-1]])
    logits = model(x)[0, len(prompt) - 1 :].astype(mx.float32)
    top = mx.argsort(-logits, axis=-1)[:, :TOP_K]
    out = []
    for (i, k), (a, b) in zip(
        top.tolist(), mx.take_along_axis(logits, top, -1).tolist(), strict=True
    ):
        p = 1.0 / (1.0 + math.exp(b - a))
        out.append({i: p, k: 1.0 - p})
    return out


def _z(count: int, p: float, n: int) -> float:
    """One-sample z statistic of count / n against the probability p."""
    se = math.sqrt(max(p * (1 - p) / n, 1e-12))
    return abs(count / n - p) / se


def test_sampled_tokens_keep_their_distribution_with_drafts(tiny_model) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    prompt = tok.encode("Tell me a long story about a cat")
    prediction = _samples(model, prompt, range(1), None, temp=0.0)[0]  # the likeliest path
    top2 = _top2(model, prompt, prediction)
    drafted = _samples(
        model, prompt, range(10_000, 10_000 + N), Speculation("prediction", 4, prediction)
    )
    p, zs = 1.0, []
    for j in range(LENGTH):
        p *= top2[j].get(prediction[j], 0.0)  # the chance a row repeats the prediction through j
        b = sum(1 for s in drafted if s[: j + 1] == prediction[: j + 1])
        zs.append(round(_z(b, p, N), 2))
    assert max(zs) < 4.0, zs
    first = Counter(s[0] for s in drafted)
    assert set(first) <= set(top2[0]), first
    for token, q in top2[0].items():
        assert _z(first[token], q, N) < 4.0, (token, first[token], q)
