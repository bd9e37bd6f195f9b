"""The README's example against the embedded default model (SmolLM2-135M-Instruct): the
official `openai` SDK gets real English back, streamed and not."""

import openai
import pytest

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_readme_example_answers_paris(smollm2_server) -> None:
    client = openai.OpenAI(base_url=smollm2_server.v1, api_key="unused")
    reply = client.chat.completions.create(model="default_model", messages=QUESTION, max_tokens=20)
    assert "Paris" in reply.choices[0].message.content
    stream = client.chat.completions.create(
        model="default_model", messages=QUESTION, max_tokens=20, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == reply.choices[0].message.content  # greedy: the same answer either way
