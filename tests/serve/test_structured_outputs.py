"""Structured outputs over HTTP: OpenAI `response_format`
(json_schema, json_object), Responses `text.format` and vLLM's `structured_outputs` (regex,
choice) through the official
`openai` SDK against a live server on a random-weight qwen3 at temperature 1 (random logits are
the adversarial case). mlx_lm.server ignores both fields (mlx-lm #1007): there is no peer to
compare bits with, so every output is checked against its schema, pattern or choices. Bad ones
are 400s naming the field, and constrained and free requests share one batch."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person."}]


@pytest.fixture(scope="module")
def client(qwen3_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")


def _chat(client: openai.OpenAI, seed: int, max_tokens: int = 400, **kw) -> Any:
    return client.chat.completions.create(
        model="default_model", messages=ASK, temperature=1.0, seed=seed, max_tokens=max_tokens,
        **kw,
    )  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_outputs_validate(client: openai.OpenAI, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = _chat(client, seed, response_format=fmt)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"  # EOS came only once the object was complete
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_schema_and_free_text_share_a_batch(client: openai.OpenAI) -> None:
    """Concurrent constrained and free requests; the constrained ones still validate."""
    kinds = [{"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}, None] * 2

    def one(i: int, fmt: Any) -> Any:  # free rows stop early: they only need to share steps
        return _chat(client, i, max_tokens=400 if fmt else 40, response_format=fmt)

    with ThreadPoolExecutor(len(kinds)) as pool:
        outs = list(pool.map(lambda a: one(*a), enumerate(kinds)))
    for fmt, out in zip(kinds, outs, strict=True):
        if fmt is not None:
            jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


def test_vllm_structured_outputs_json_validates(client: openai.OpenAI) -> None:
    out = _chat(client, 4, extra_body={"structured_outputs": {"json": PERSON}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


def test_responses_text_format_validates(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    out = client.responses.create(
        model="default_model", input="Describe a person.", temperature=1.0, max_output_tokens=400,
        text={"format": fmt},
    )  # fmt: skip
    jsonschema.validate(json.loads(out.output_text), PERSON)


def test_regex_and_choice_match_exactly(client: openai.OpenAI) -> None:
    pattern = r"(yes|no), [0-9]{2,4}"
    for seed in (4, 5):
        out = _chat(client, seed, extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, out.choices[0].message.content)
        pick = _chat(client, seed, extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}})
        assert pick.choices[0].message.content in ("alpha", "beta")
    text = client.completions.create(
        model="default_model", prompt="Answer:", temperature=1.0, seed=9, max_tokens=40,
        extra_body={"structured_outputs": {"regex": pattern}},
    )  # fmt: skip
    assert re.fullmatch(pattern, text.choices[0].text)


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type", "unknown type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "needs a schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "not": {"type": "string"}}}}},
            "response_format.json_schema.schema",
            "not",
        ),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", ""),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "one of"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400_naming_the_field(
    client: openai.OpenAI, body: dict, param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, 0, extra_body=body)
    error = e.value.body if isinstance(e.value.body, dict) else {}
    error = error.get("error", error)
    assert error.get("param") == param
    assert words in error.get("message", "")
    assert _chat(client, 0, max_tokens=4).choices[0].message.content is not None  # still serving


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_returns_that_call_with_valid_arguments(
    client: openai.OpenAI, stream: bool
) -> None:
    choice = {"type": "function", "function": {"name": "add"}}
    kw = dict(model="default_model", messages=ASK, tools=TOOLS, tool_choice=choice,
              temperature=1.0, seed=3, max_tokens=200)  # fmt: skip
    if stream:
        calls: dict[int, dict] = {}
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                assert not c.delta.content  # the call's JSON is not streamed as text
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
        got = [calls[i] for i in sorted(calls)]
    else:
        out = client.chat.completions.create(**kw)
        finish = out.choices[0].finish_reason
        got = [{"name": c.function.name, "arguments": c.function.arguments}
               for c in out.choices[0].message.tool_calls]  # fmt: skip
    assert finish == "tool_calls"
    assert [c["name"] for c in got] == ["add"]
    jsonschema.validate(json.loads(got[0]["arguments"]), SCHEMAS["add"])


def test_tool_choice_required_returns_valid_calls(client: openai.OpenAI) -> None:
    """Random logits may keep adding calls to the array past max_tokens (then `length`, and the
    partial JSON stays text); the seeds here finish, and every call they make validates."""
    for seed in (1, 2, 3):
        out = client.chat.completions.create(
            model="default_model", messages=ASK, tools=TOOLS, tool_choice="required",
            temperature=1.0, seed=seed, max_tokens=600,
        )  # fmt: skip
        calls = out.choices[0].message.tool_calls
        assert out.choices[0].finish_reason == "tool_calls" and calls, out.choices[0]
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_forcing_a_tool_without_tools_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, 0, tool_choice="required")
    assert "needs tools" in str(e.value)


def test_anthropic_tool_choice_and_output_format(qwen3_server) -> None:
    """The official anthropic SDK: tool_choice tool / any give tool_use blocks whose input
    validates; output_config.format gives text that validates."""
    import anthropic

    sdk = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused")
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    ask = [{"role": "user", "content": "Add two numbers."}]
    for choice in ({"type": "tool", "name": "add"}, {"type": "any"}):
        msg = sdk.messages.create(model="default_model", max_tokens=600, messages=ask, tools=tools,
                                  tool_choice=choice, extra_body={"temperature": 1.0})  # fmt: skip
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason == "tool_use" and uses
        for use in uses:
            jsonschema.validate(use.input, SCHEMAS[use.name])
        if choice["type"] == "tool":
            assert [u.name for u in uses] == ["add"]
    out = sdk.messages.create(
        model="default_model", max_tokens=400, messages=ask,
        extra_body={"temperature": 1.0,
                    "output_config": {"format": {"type": "json_schema", "schema": PERSON}}},
    )  # fmt: skip
    assert out.stop_reason == "end_turn"
    jsonschema.validate(json.loads(out.content[0].text), PERSON)


def test_n_choices_each_follow_the_schema(client: openai.OpenAI) -> None:
    """n = 3 from one prompt prefilled once: every sibling has its own grammar state."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = _chat(client, 7, n=3, response_format=fmt)
    texts = [c.message.content for c in out.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # each choice samples its own stream


def test_a_lark_grammar_and_a_bad_one(client: openai.OpenAI) -> None:
    grammar = 'start: "move " DIR " " NUM\nDIR: "left" | "right"\nNUM: /[1-9]/'
    out = _chat(client, 2, extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"move (left|right) [1-9]", out.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, 2, extra_body={"structured_outputs": {"grammar": "start: ( unclosed"}})
    error = e.value.body if isinstance(e.value.body, dict) else {}
    assert error.get("error", error).get("param") == "structured_outputs.grammar"
