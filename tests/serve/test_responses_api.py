"""/v1/responses on a live server (tiny random qwen3, real Qwen3 template) with the openai SDK:
shapes, prompts (token counts rendered independently with transformers), streaming events,
storage, chaining, restarts and errors."""

from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import Response
from transformers import AutoTokenizer

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FLAT_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": PARAMS,
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS},
}


@pytest.fixture(scope="module")
def client(qwen3_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen3_server.v1, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_model_dir: Path):
    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


def prompt_len(tok, messages: list[dict], tools: list[dict] | None = None) -> int:
    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding or ids


def test_string_input_shape_and_prompt(qwen3_server, hf_tokenizer) -> None:
    body = {"model": "default_model", "input": "Hello there", "max_output_tokens": 4}
    raw = httpx.post(qwen3_server.v1 + "/responses", json=body, timeout=60).json()
    r = Response.model_validate(raw)  # strict: every required field has the SDK's type
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "default_model"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4 and r.max_output_tokens == 4 and r.store is True
    expected = prompt_len(hf_tokenizer, [{"role": "user", "content": "Hello there"}])
    assert r.usage.input_tokens == expected
    assert r.usage.total_tokens == expected + 4
    assert [o.type for o in r.output if o.type == "message"] == ["message"]
    assert r.output_text == "".join(o.content[0].text for o in r.output if o.type == "message")


def test_item_input_and_instructions(client, hf_tokenizer) -> None:
    r = client.responses.create(
        model="default_model",
        instructions="Answer in French.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}],
            },
            {"role": "user", "content": "How are you?"},
        ],
        max_output_tokens=2,
    )
    expected = prompt_len(
        hf_tokenizer,
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "How are you?"},
        ],
    )
    assert r.usage.input_tokens == expected and r.instructions == "Answer in French."


def test_tools_and_a_tool_call_history_render_into_the_prompt(client, hf_tokenizer) -> None:
    args = '{"city": "Paris"}'
    r = client.responses.create(
        model="default_model",
        tools=[FLAT_TOOL],
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "I should call the tool."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": args,
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "22C, sunny"},
        ],
        max_output_tokens=1,
    )
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22C, sunny"},
    ]
    expected = prompt_len(hf_tokenizer, messages, [CHAT_TOOL])
    assert r.usage.input_tokens == expected
    assert expected != prompt_len(hf_tokenizer, messages)  # the tools do count
    assert r.tools[0].name == "get_weather"
    none = client.responses.create(
        model="default_model",
        tools=[FLAT_TOOL],
        tool_choice="none",
        input="hi",
        max_output_tokens=1,
    )  # tool_choice none hides the tools from the template
    assert none.usage.input_tokens == prompt_len(hf_tokenizer, [{"role": "user", "content": "hi"}])


def test_stream_event_order(client) -> None:
    stream = client.responses.create(
        model="default_model", input="Tell me a story", max_output_tokens=6, stream=True
    )
    events = list(stream)
    names = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert names[-1] == "response.incomplete"  # 6 tokens of random text never reach EOS
    final = events[-1].response
    assert [o.type for o in final.output] == ["message"]
    collapsed = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert collapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    message = final.output[0]
    text_events = [e for e in events if getattr(e, "item_id", None) == message.id]
    assert events[2].item.id == message.id and events[2].item.status == "in_progress"
    done_text = next(e.text for e in text_events if e.type == "response.output_text.done")
    joined = "".join(e.delta for e in text_events if e.type == "response.output_text.delta")
    assert joined == done_text == message.content[0].text
    assert final.usage.output_tokens == 6 and final.status == "incomplete"
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_get_delete_and_store_false(client, qwen3_server) -> None:
    r = client.responses.create(model="default_model", input="x", max_output_tokens=2)
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    url = f"{qwen3_server.v1}/responses/{r.id}"
    assert httpx.delete(url).json() == {"id": r.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    gone = httpx.delete(url)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    unstored = client.responses.create(
        model="default_model", input="x", max_output_tokens=2, store=False
    )
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_chain_of_previous_responses_renders_the_whole_history(client, hf_tokenizer) -> None:
    first = client.responses.create(
        model="default_model", instructions="Be terse.", input="One", max_output_tokens=3
    )
    second = client.responses.create(
        model="default_model", previous_response_id=first.id, input="Two", max_output_tokens=3
    )
    third = client.responses.create(
        model="default_model",
        previous_response_id=second.id,
        instructions="Be kind.",
        input=[{"role": "user", "content": "Three"}],
        max_output_tokens=1,
    )
    history = [
        {"role": "system", "content": "Be kind."},  # instructions are not carried over
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Two"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Three"},
    ]
    assert third.usage.input_tokens == prompt_len(hf_tokenizer, history)
    assert third.previous_response_id == second.id


def test_unknown_previous_response_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="default_model", input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    assert "resp_nope" in e.value.body["message"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({}, "input"),
        ({"input": 123}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
        ({"input": "x", "tool_choice": "required", "tools": [FLAT_TOOL]}, "tool_choice"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "stream": "yes"}, "stream"),
    ],
)
def test_bad_requests_are_400_and_the_server_keeps_serving(qwen3_server, extra, param) -> None:
    url = qwen3_server.v1 + "/responses"
    bad = httpx.post(url, json={"model": "default_model", **extra}, timeout=60)
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    ok = httpx.post(url, json={"input": "still there?", "max_output_tokens": 1}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 1


def test_invalid_json_body_is_400(qwen3_server) -> None:
    bad = httpx.post(qwen3_server.v1 + "/responses", content=b"{nope", timeout=30)
    assert bad.status_code == 400 and "error" in bad.json()


def test_openapi_documents_the_routes(qwen3_server) -> None:
    doc = httpx.get(qwen3_server.url + "/openapi.json", timeout=30).json()
    post = doc["paths"]["/v1/responses"]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["input"]["oneOf"][0] == {"type": "string"}
    assert set(doc["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}
