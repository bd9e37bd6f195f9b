"""/v1/responses on the embedded real model (SmolLM2-135M-Instruct): real text, the SDK's
streaming helper to completion, and a previous_response_id turn re-rendering the history.
Each request costs seconds on a CPU, so the file keeps to three."""

import openai
import pytest
from serve.conftest import LiveServer
from transformers import AutoTokenizer

from mlxd.model.default import default_model_path

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smol(smollm2_server: LiveServer) -> LiveServer:
    return smollm2_server


@pytest.fixture(scope="module")
def client(smol: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol.v1, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def hf_tokenizer(smol: LiveServer):
    """The model folder's tokenizer loaded by transformers itself (not the server's copy)."""
    return AutoTokenizer.from_pretrained(str(default_model_path()))


def prompt_len(tok, messages: list[dict]) -> int:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding or ids


def test_stream_helper_reaches_completed(client: openai.OpenAI) -> None:
    deltas = []
    with client.responses.stream(
        model="default_model", input=QUESTION, temperature=0, max_output_tokens=12
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status == "completed" and "Paris" in final.output_text
    assert "".join(deltas) == final.output_text and len(deltas) > 3


def test_paris_then_a_previous_response_id_turn(client: openai.OpenAI, hf_tokenizer) -> None:
    first = client.responses.create(
        model="default_model",
        input=QUESTION,
        temperature=0,
        max_output_tokens=12,
    )
    assert "Paris" in first.output_text
    assert first.status == "completed" and first.incomplete_details is None
    assert [o.type for o in first.output] == ["message"] and first.output[0].status == "completed"
    follow = "And of Italy?"
    second = client.responses.create(
        model="default_model",
        previous_response_id=first.id,
        input=follow,
        temperature=0,
        max_output_tokens=1,
    )
    assert second.previous_response_id == first.id
    new_input = len(hf_tokenizer.encode(follow, add_special_tokens=False))
    u1, u2 = first.usage, second.usage
    assert u2.input_tokens >= u1.input_tokens + u1.output_tokens + new_input
    # The stored answer re-rendered as an assistant turn, then the new input:
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow},
    ]
    assert u2.input_tokens == prompt_len(hf_tokenizer, history)
