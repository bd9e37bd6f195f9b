"""/v1/responses with a scripted model (tests/serve/scripted.py) on the real Qwen3 template and
mlx-lm's tool parser: think blocks become reasoning items, tool blocks function_call items,
streamed as OpenAI streams them; the call's output sent back renders into the next prompt."""

import json

import openai
import pytest
from scripted import chat_prompt_len, script_server
from transformers import AutoTokenizer

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FLAT = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": PARAMS}
CHAT = {"type": "function", "function": {k: v for k, v in FLAT.items() if k != "type"}}
SAYS = (
    "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def scripted(make_server, qwen3_model_dir):
    live = make_server()
    model = script_server(live)
    tok = AutoTokenizer.from_pretrained(str(qwen3_model_dir))
    sdk = openai.OpenAI(base_url=live.v1, api_key="x", max_retries=0)

    def say(text: str, messages: list[dict], tools: list[dict] | None = None) -> int:
        ids = tok.encode(text, add_special_tokens=False)
        n = chat_prompt_len(tok, messages, tools)
        model.say(ids, n)
        return n

    return sdk, say


def check_output(r) -> None:
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = r.output
    assert reasoning.content[0].text == "The user wants weather." and reasoning.summary == []
    assert message.content[0].text == "Let me check." and message.status == "completed"
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.status == "completed" and call.call_id and call.id.startswith("fc_")
    assert r.status == "completed" and r.usage.output_tokens_details.reasoning_tokens > 0


def test_reasoning_text_and_a_function_call(scripted) -> None:
    sdk, say = scripted
    n = say(SAYS, ASK, [CHAT])
    r = sdk.responses.create(model="default_model", input="Weather in Paris?", tools=[FLAT])
    check_output(r)
    assert r.usage.input_tokens == n


def test_streamed_function_call_then_its_output_sent_back(scripted) -> None:
    sdk, say = scripted
    say(SAYS, ASK, [CHAT])
    with sdk.responses.stream(
        model="default_model", input="Weather in Paris?", tools=[FLAT]
    ) as stream:
        events = list(stream)
        first = stream.get_final_response()
    check_output(first)
    names = [e.type for e in events]
    collapsed = [x for i, x in enumerate(names) if i == 0 or names[i - 1] != x]
    assert collapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function_call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert done.arguments == first.output[2].arguments and done.output_index == 2
    call = first.output[2]
    # The result goes back on the stored conversation: the template sees the whole loop.
    history = ASK + [
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "The user wants weather.",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, clear"},
    ]
    n = say("It is 18 C and clear.", history, [CHAT])
    second = sdk.responses.create(
        model="default_model",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C, clear"}],
        tools=[FLAT],
    )
    assert second.usage.input_tokens == n
    assert second.output_text == "It is 18 C and clear." and second.status == "completed"
