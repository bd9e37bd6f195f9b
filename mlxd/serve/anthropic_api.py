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

from .anthropic_convert import (
    Conversation,
    constrain,
    convert_request,
    model_name,
    read_params,
    render,
)
from .anthropic_stream import StopWords, error_event, events, fold
from .app import ServerState
from .errors import APIError, bad_request, read_json
from .generation import Generation
from .limits import check_fits, message_text_bytes
from .media import MediaPolicy
from .openapi import operation
from .params import GenParams, load_model, model_ref
from .prompt import Prompt
from .provider import Served
from .schemas import body_schema
from .streaming import as_json, offload, sse_event, sse_stream, until_done_or_disconnect
from .tools_warning import tools_warning

log = logging.getLogger("mlxd.serve")


async def _prompt(
    state: ServerState, body: dict[str, Any], params: GenParams
) -> tuple[Served, Conversation, Prompt]:
    """The body checked whole (`params` get its constraint), then the model looked up, the
    text's size checked against the context (limits.py), and only then the template run."""
    model_name(body)  # required here
    ref = model_ref(body)
    conv = convert_request(body, state.config.chat_template_args, MediaPolicy.of(state.config))
    constrain(params, body, conv.tools)
    served = await load_model(state, ref, fallback=True)
    check_fits(served, message_text_bytes(conv.messages))
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
    params = read_params(body, state.config)
    served, conv, prompt = await _prompt(state, body, params)
    gen = Generation(served, prompt, params, conv.tools, state.metrics, "messages", arrival)
    await gen.start(state)
    reply = events(gen, model, StopWords(served.tokenizer, params.stop), conv.prefill)
    if stream:
        response = sse_stream(_frames(reply), gen.behind)
    else:
        response = await until_done_or_disconnect(request, as_json(fold(reply)), gen)
    response.headers.update(tools_warning(served, conv.tools, conv.template_args))
    return response


async def _frames(reply: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[str]:
    """SSE frames; a client that goes away closes `reply` at once, which cancels the rows."""
    async with aclosing(reply):
        try:
            async for event in reply:
                yield sse_event(event["type"], event)
        except APIError as e:  # a refusal once the status line is out (--request-timeout)
            log.warning("a stream ended with %d: %s", e.status, e)
            yield sse_event("error", error_event(e))
        except Exception as e:  # noqa: BLE001 - the status line is gone: Anthropic's error event
            log.exception("a stream failed after its status line: error event sent")
            yield sse_event("error", error_event(e))


async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    body = await read_json(request)
    _, _, prompt = await _prompt(state, body, GenParams())  # refuses what /v1/messages would
    return JSONResponse({"input_tokens": len(prompt.tokens)})


def add_routes(app: FastAPI) -> None:
    for path, endpoint, name, stream in (
        ("/v1/messages", messages, "messages", True),
        ("/v1/messages/count_tokens", count_tokens, "count_tokens", False),
    ):
        extra = {**body_schema(name), **operation(path, name, stream)}
        app.add_api_route(
            path, endpoint, methods=["POST"], openapi_extra=extra, response_model=None
        )
