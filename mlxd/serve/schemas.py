"""Request-body JSON Schemas for the OpenAPI document (what clients and the fuzz tests read):
OpenAI chat and completions, Anthropic Messages, OpenAI Responses. Handlers validate bodies
themselves, with mlx_lm.server's rules and messages (and Anthropic's, and OpenAI's)."""

from typing import Any

_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repetition_penalty": {"type": "number", "minimum": 0},
    "presence_penalty": {"type": "number", "minimum": -1e6, "maximum": 1e6},
    "frequency_penalty": {"type": "number", "minimum": -1e6, "maximum": 1e6},
    "xtc_probability": {"type": "number", "minimum": 0, "maximum": 1},
    "xtc_threshold": {"type": "number", "minimum": 0, "maximum": 0.5},
    "logit_bias": {
        "type": "object",
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number"},
    },
    "logprobs": {"type": "boolean"},
    "top_logprobs": {"type": "integer", "minimum": -1, "maximum": 11},
    "seed": {"type": "integer"},
    "n": {"type": "integer", "minimum": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "speculative": {"type": "string", "enum": ["ngram", "off"]},  # null: --speculative's
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {"type": "null"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    },
                },
            ]
        },
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
}

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
# OpenAI's Predicted Outputs: refused with n > 1, logprobs, positive penalties, tools, audio.
_PREDICTION = {
    "type": "object",
    "required": ["type", "content"],
    "properties": {
        "type": {"const": "content"},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "chat": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"type": "string", "enum": ["none", "auto"]},
            "chat_template_kwargs": {"type": "object"},
            "prediction": _PREDICTION,
        },
    },
    "completions": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                    {"type": "array", "minItems": 1, "maxItems": 128, "items": {"type": "string"}},
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 128,
                        "items": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "integer", "minimum": 0},
                        },
                    },
                ]
            },
            "logprobs": {  # OpenAI's integer: its legacy logprobs object (http-api.md)
                "oneOf": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 11}]
            },
        },
    },
}


# Anthropic Messages. The handlers answer 400 naming the field; this mirrors what they accept
# (an optional field may be null: the same as leaving it out).
def _null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


_STR: dict[str, Any] = {"type": "string"}
_TEXT = _obj(["type", "text"], type={"const": "text"}, text=_STR)
_TOOL_RESULT = _obj(
    ["type", "tool_use_id"],
    type={"const": "tool_result"},
    tool_use_id=_STR,
    content=_null({"oneOf": [_STR, {"type": "array", "items": _TEXT}]}),
    is_error=_null({"type": "boolean"}),
)
_TOOL_USE = _obj(
    ["type", "id", "name", "input"],
    type={"const": "tool_use"},
    id=_STR,
    name=_STR,
    input={"type": "object"},
)
_THINKING = _obj(["type", "thinking"], type={"const": "thinking"}, thinking=_STR)
_REDACTED = _obj(["type"], type={"const": "redacted_thinking"})  # dropped unread


def _turn(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    content = {"oneOf": [_STR, {"type": "array", "items": {"oneOf": list(blocks)}}]}
    return _obj(["role", "content"], role={"const": role}, content=content)


_PROMPT_FIELDS: dict[str, Any] = {
    "model": _STR,
    "messages": {
        "type": "array",
        "minItems": 1,
        "items": {
            "oneOf": [
                _turn("user", _TEXT, _TOOL_RESULT),  # images and documents: 400
                _turn("assistant", _TEXT, _TOOL_USE, _THINKING, _REDACTED),
            ]
        },
    },
    "system": _null({"oneOf": [_STR, {"type": "array", "items": _TEXT}]}),
    "tools": _null(
        {
            "type": "array",
            "items": _obj(
                ["name", "input_schema"],
                type=_null({"const": "custom"}),  # server tools: 400
                name={"type": "string", "minLength": 1},
                description=_null(_STR),
                input_schema={"type": "object"},
            ),
        }
    ),
    # `any` and `tool` need constrained decoding: 400
    "tool_choice": _null(_obj(["type"], type={"enum": ["auto", "none"]})),
    "thinking": _null(
        _obj(
            ["type"],
            type={"enum": ["enabled", "adaptive", "disabled"]},
            budget_tokens=_null({"type": "integer", "minimum": 0}),
        )
    ),
    # `format` (structured outputs) needs constrained decoding: 400
    "output_config": _null(
        {"type": "object", "properties": {"effort": _null(_STR), "format": {"type": "null"}}}
    ),
}
ANTHROPIC: dict[str, dict[str, Any]] = {
    "messages": _obj(
        ["model", "messages", "max_tokens"],
        **_PROMPT_FIELDS,
        max_tokens={"type": "integer", "minimum": 1},
        temperature=_null({"type": "number", "minimum": 0}),
        top_p=_null({"type": "number", "minimum": 0, "maximum": 1}),
        top_k=_null({"type": "integer", "minimum": 0}),
        stop_sequences=_null({"type": "array", "items": _STR}),
        stream=_null({"type": "boolean"}),
        metadata=_null({"type": "object"}),
        speculative=_null({"enum": ["ngram", "off"]}),
    ),
    "count_tokens": _obj(["model", "messages"], **_PROMPT_FIELDS),
}


_OBJECT = {"type": "object"}
RESPONSES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": _OBJECT}]},
        "instructions": {"type": "string"},
        "tools": {"type": "array", "items": {**_OBJECT, "required": ["type", "name"]}},
        "tool_choice": {"oneOf": [{"enum": ["auto", "none", "required"]}, _OBJECT]},
        "text": {"type": "object", "properties": {"format": _OBJECT}},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "store": {"type": "boolean"},
        "previous_response_id": {"type": "string"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "parallel_tool_calls": {"type": "boolean"},
        "chat_template_kwargs": {"type": "object"},
        "speculative": {"type": "string", "enum": ["ngram", "off"]},
    },
}

SCHEMAS.update(ANTHROPIC, responses=RESPONSES)


def body_schema(name: str) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body follows SCHEMAS[name]."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": SCHEMAS[name]}},
        }
    }
