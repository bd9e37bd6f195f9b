"""Request-body JSON Schemas for the OpenAPI document (what clients and the fuzz test read).
Handlers validate bodies themselves, with mlx_lm.server's rules and messages."""

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
                ]
            },
        },
    },
}


def body_schema(name: str) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body follows SCHEMAS[name]."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": SCHEMAS[name]}},
        }
    }
