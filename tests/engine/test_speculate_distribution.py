"""Sampled output keeps its distribution under speculation (sample-and-match): over hundreds of
seeded rows at temperature 1 (top-k 2, so each position has few outcomes), how often each
position repeats the prediction's token, and the first token's distribution, are the same with
a prediction to draft from as without one (two-sample tests at four standard errors). A verify
step that kept drafts the target did not sample would repeat the prediction far more often."""

import math
from collections import Counter

import mlx.core as mx
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest, Speculation
from mlxd.engine.sampling import SamplingParams

N, LENGTH, TOP_K = 200, 5, 2


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


def _z(a: int, b: int, n: int) -> float:
    """Two-proportion z statistic of a / n against b / n."""
    p = (a + b) / (2 * n)
    se = math.sqrt(max(p * (1 - p) * 2 / n, 1e-12))
    return abs(a - b) / n / se


def test_sampled_tokens_keep_their_distribution_with_drafts(tiny_model) -> None:
    from mlx_lm import load

    model, tok = load(str(tiny_model("qwen3")))
    prompt = tok.encode("Tell me a long story about a cat")
    prediction = _samples(model, prompt, range(1), None, temp=0.0)[0]  # the likeliest path
    plain = _samples(model, prompt, range(N), None)
    drafted = _samples(
        model, prompt, range(10_000, 10_000 + N), Speculation("prediction", 4, prediction)
    )
    for j in range(1, LENGTH):
        a = sum(1 for s in plain if s[: j + 1] == prediction[: j + 1])
        b = sum(1 for s in drafted if s[: j + 1] == prediction[: j + 1])
        assert _z(a, b, N) < 4.0, (j, a, b)
    first_plain, first_drafted = Counter(s[0] for s in plain), Counter(s[0] for s in drafted)
    for token in set(first_plain) | set(first_drafted):
        assert _z(first_plain[token], first_drafted[token], N) < 4.0, token
