"""Anthropic Messages: `POST /v1/messages` (streaming or not) and
`POST /v1/messages/count_tokens`, on the same engine, templates and parsers as the OpenAI
endpoints. A model id the server does not know (`claude-sonnet-4-5`) means the served model.
Errors take Anthropic's shape (errors.py, by path)."""

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import sse
from .anthropic_convert import (
    Conversation,
    constrain,
    convert_request,
    model_name,
    read_params,
    render,
)
from .anthropic_stream import StopWords, error_event, events, fold
from .body import read_json
from .errors import bad_request
from .generation import Generation
from .offload import offload
from .params import GenParams
from .prompt import Prompt
from .provider import Served
from .request_checks import load_model
from .state import ServerState
from .waiting import until_done_or_disconnect

log = logging.getLogger("mlxd.serve")


async def _prompt(state: ServerState, body: dict[str, Any]) -> tuple[Served, Conversation, Prompt]:
    model_name(body)
    conv = convert_request(body, state.template_args)
    served = await load_model(state, body, fallback=True)
    prompt = await offload(lambda: render(served.tokenizer, conv))
    return served, conv, prompt


async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    with state.provider.arrivals.coming() as arrival:  # a new wave may wait for this one
        return await _messages(request, state, arrival)


async def _messages(request: Request, state: ServerState, arrival: Any) -> Response:
    body = await read_json(request)
    model = model_name(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise bad_request("stream must be of type bool", "stream")
    params = read_params(body, state.args)
    served, conv, prompt = await _prompt(state, body)
    constrain(params, body, conv.tools)
    gen = Generation(served, prompt, params, conv.tools, state.metrics, "messages", arrival)
    await gen.start(state.args)
    reply = events(gen, model, StopWords(served.tokenizer, params.stop), conv.prefill)
    if stream:
        return sse.stream(_frames(reply), gen.behind)
    message = await until_done_or_disconnect(request, fold(reply), gen)
    return JSONResponse(message)


async def _frames(reply: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[str]:
    """SSE frames; a client that goes away closes `reply` at once, which cancels the rows."""
    async with aclosing(reply):
        try:
            async for event in reply:
                yield sse.event(event["type"], event)
        except Exception as e:  # noqa: BLE001 - the status line is gone: Anthropic's error event
            log.exception("a stream failed after its status line: error event sent")
            yield sse.event("error", error_event(e))


async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    body = await read_json(request)
    _, conv, prompt = await _prompt(state, body)
    constrain(GenParams(), body, conv.tools)  # refuses what /v1/messages would refuse
    return JSONResponse({"input_tokens": len(prompt.tokens)})


# The request bodies (for the OpenAPI document and the fuzz tests). The handlers validate
# bodies themselves and answer 400 naming the field; this mirrors what they accept (an
# optional field may be null: the same as leaving it out).
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
SCHEMAS: dict[str, dict[str, Any]] = {
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
    ),
    "count_tokens": _obj(["model", "messages"], **_PROMPT_FIELDS),
}


def _body(name: str) -> dict[str, Any]:
    schema = SCHEMAS[name]
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def add_routes(app: FastAPI, state: ServerState) -> None:
    for path, endpoint, name in (
        ("/v1/messages", messages, "messages"),
        ("/v1/messages/count_tokens", count_tokens, "count_tokens"),
    ):
        app.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            openapi_extra=_body(name),
            response_model=None,
        )
