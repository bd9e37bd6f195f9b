"""OpenAI's Responses API: `POST /v1/responses` (plain or streamed), `GET` and `DELETE
/v1/responses/{id}`. Responses are stored (unless `store: false`) so `previous_response_id`
continues a conversation, across restarts too (responses_store.py, bounded in count and age).
Function tools and tool_choice auto/none are honoured, and a `text.format` (JSON schema or
object) is enforced as the row's grammar; `required` and named tools are a 400.
"""

import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .app import ServerState
from .errors import APIError, bad_request, read_json
from .generation import Generation
from .limits import check_fits, message_text_bytes
from .media import MediaPolicy
from .openapi import operation
from .params import GenParams, apply_tool_choice, check, load_model, model_ref, read_params
from .prompt import chat_prompt, normalize_messages
from .responses_convert import chat_tools, flat_tools, input_items, new_id, to_messages
from .responses_store import ResponseStore
from .responses_stream import ResponseRun
from .schemas import body_schema
from .streaming import as_json, offload, sse_stream, until_done_or_disconnect
from .tools_warning import tools_warning

# mlx-lm sampling extras and mlxd's `speculative` a Responses body may carry too (read with
# chat's rules).
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
           "speculative")  # fmt: skip


def _refuse_unsupported(body: dict[str, Any]) -> None:
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad_request("text must be an object", "text")
    for name in ("background", "conversation", "prompt"):
        if body.get(name) not in (None, False):
            raise bad_request(f"{name} is not supported", name)
    if body.get("prediction") is not None:  # OpenAI's Responses API has no predicted outputs
        raise bad_request("prediction is a chat completions field", "prediction")
    if body.get("top_logprobs") not in (None, 0):
        raise bad_request("top_logprobs is not supported on /v1/responses yet", "top_logprobs")


def _params(body: dict[str, Any], defaults: Any) -> GenParams:
    sub = {k: body[k] for k in ("temperature", "top_p", "seed", *_EXTRAS) if k in body}
    if body.get("max_output_tokens") is not None:
        sub["max_tokens"] = check("max_output_tokens", body["max_output_tokens"], int, lo=1)
    params = read_params(sub, defaults)
    params.constraint = text_format(body.get("text"))
    return params


def text_format(text: dict[str, Any] | None) -> Any:
    """Responses' `text.format` (json_schema flattened, or json_object) as a constraint."""
    from ..constrain import ConstraintError, from_response_format

    try:
        return from_response_format((text or {}).get("format"), "text.format")
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from e


class ResponseRequest:
    """A validated `POST /v1/responses` body."""

    def __init__(self, state: ServerState, body: dict[str, Any]) -> None:
        self.state, self.body = state, body
        self.stream = _flag(body, "stream", False)
        self.store = _flag(body, "store", True)
        self.items = input_items(body.get("input"))
        self.instructions = body.get("instructions")
        if self.instructions is not None and not isinstance(self.instructions, str):
            raise bad_request("instructions must be a string", "instructions")
        self.previous = body.get("previous_response_id")
        if self.previous is not None and not isinstance(self.previous, str):
            raise bad_request("previous_response_id must be a string", "previous_response_id")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise bad_request("metadata must be an object", "metadata")
        self.all_tools = chat_tools(body.get("tools"))
        self.tools = apply_tool_choice(self.all_tools, body.get("tool_choice"))
        _refuse_unsupported(body)
        self.params = _params(body, state.config)
        self.model = model_ref(body)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
        self.template_args = {**state.config.chat_template_args, **kwargs}

    async def history(self) -> list[dict[str, Any]]:
        """The previous response's input items and output items (404 when not stored)."""
        if self.previous is None:
            return []
        found = await self.state.store.load(self.previous)
        if found is None:
            message = f"Previous response with id '{self.previous}' not found."
            raise APIError(404, message, param="previous_response_id")
        items, response = found
        return items + response["output"]

    def head(self, model: str) -> dict[str, Any]:
        """The response object's fields that echo the request."""
        b, p = self.body, self.params
        return {
            "id": new_id("resp"),
            "created_at": int(time.time()),
            "instructions": self.instructions,
            "max_output_tokens": b.get("max_output_tokens"),
            "metadata": b.get("metadata") or {},
            "model": model,
            "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
            "previous_response_id": self.previous,
            "reasoning": b.get("reasoning") or {"effort": None, "summary": None},
            "store": self.store,
            "temperature": p.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": b.get("tool_choice") or "auto",
            "tools": flat_tools(self.all_tools),
            "top_p": p.top_p,
            "truncation": "disabled",
            "user": b.get("user"),
            "background": False,
        }


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    return default if value is None else check(name, value, bool)


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    with state.provider.arrivals.coming() as arrival:  # a new wave may wait for this one
        return await _create(request, state, arrival)


async def _create(request: Request, state: ServerState, arrival: Any) -> Response:
    body = await read_json(request)
    req = ResponseRequest(state, body)
    if not req.items:
        raise bad_request("input is required", "input")
    items = await req.history() + req.items
    messages = normalize_messages(
        to_messages(items, req.instructions, MediaPolicy.of(state.config))
    )
    served = await load_model(state, req.model)
    check_fits(served, message_text_bytes(messages), "input")  # before the template (limits.py)
    args = req.template_args
    prompt = await offload(lambda: chat_prompt(served.tokenizer, messages, req.tools, args))
    gen = Generation(served, prompt, req.params, req.tools, state.metrics, "responses", arrival)
    await gen.start(state)
    model = body.get("model") or served.name
    run = ResponseRun(req.head(model), gen, items, state.store if req.store else None)
    if req.stream:
        response = sse_stream(run.frames(), gen.behind)
    else:
        response = await until_done_or_disconnect(request, as_json(run.whole()), gen)
    response.headers.update(tools_warning(served, req.tools, args))
    return response


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id")


async def get_response(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    response_id = request.path_params["response_id"]
    found = await state.store.load(response_id)
    if found is None:
        raise _not_found(response_id)
    return JSONResponse(found[1])


async def delete_response(request: Request) -> Response:
    state: ServerState = request.app.state.mlxd
    response_id = request.path_params["response_id"]
    if not await state.store.remove(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def add_routes(app: FastAPI, state: ServerState) -> None:
    config = state.config
    state.store = ResponseStore(
        Path(config.data_dir) / "responses.sqlite3",
        max_stored=config.responses_max_stored,
        max_age_s=config.responses_max_age * 86400,
    )
    create = {**body_schema("responses"), **operation("/v1/responses", "responses", True)}
    app.add_api_route("/v1/responses", create_response, methods=["POST"], openapi_extra=create,
                      response_model=None)  # fmt: skip
    path, about = "/v1/responses/{response_id}", "The id of a stored response"
    for method, endpoint, ok in (("GET", get_response, "responses"),
                                 ("DELETE", delete_response, "deleted")):  # fmt: skip
        extra = operation(path, ok, response_id=about)
        app.add_api_route(
            path, endpoint, methods=[method], openapi_extra=extra, response_model=None
        )
    if isinstance(getattr(app.router, "on_shutdown", None), list):
        app.router.on_shutdown.append(state.store.close)
