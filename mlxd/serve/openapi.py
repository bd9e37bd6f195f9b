"""What /openapi.json says about each route beyond its request body (schemas.py): its path
parameters, its errors in its API's shape (OpenAI's, or Anthropic's on /v1/messages*), the
server-sent events of a streaming route, and the JSON shapes of the answers clients parse."""

from typing import Any

_STR: dict[str, Any] = {"type": "string"}
_NULL_STR: dict[str, Any] = {"type": ["string", "null"]}
OPENAI_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {"message": _STR, "type": _STR, "param": _NULL_STR, "code": _NULL_STR},
        }
    },
}
ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": _STR, "message": _STR},
        },
    },
}
# The statuses any route may answer with an error (401 with --api-key, 404 an unknown model or
# response, 413 a body over the cap, 429/503 admission, 500 a failure).
_ERRORS = {
    "400": "The request is invalid: the message names the field",
    "401": "A missing or wrong API key (with --api-key)",
    "404": "No such model, adapter or stored response",
    "405": "The method is not allowed on this path (the Allow header lists those that are)",
    "413": "The request body is too large",
    "429": "Too many requests are waiting (Retry-After says when to try again)",
    "500": "The server failed",
    "503": "The server is overloaded or its engine stopped (Retry-After)",
}


def _object(*required: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": properties}


# The 200 bodies clients parse: the fields they read first (more may follow).
OK: dict[str, dict[str, Any]] = {
    "chat": _object("id", "object", "created", "model", "choices",
                    object={"const": "chat.completion"}, choices={"type": "array"}),
    "completions": _object("id", "object", "created", "model", "choices",
                           object={"const": "text_completion"}, choices={"type": "array"}),
    "messages": _object("id", "type", "role", "content", "model", "stop_reason", "usage",
                        type={"const": "message"}, content={"type": "array"}),
    "count_tokens": _object("input_tokens", input_tokens={"type": "integer", "minimum": 0}),
    "responses": _object("id", "object", "status", "output", object={"const": "response"},
                         output={"type": "array"}),
    "deleted": _object("id", "object", "deleted", object={"const": "response.deleted"},
                       deleted={"const": True}),
    "model": _object("id", "object", id=_STR, object={"const": "model"}),
    "models": _object("object", "data", object={"const": "list"}, data={"type": "array"}),
    "health": _object("status", status={"enum": ["ok", "degraded"]}),
}  # fmt: skip


# One server-sent event: `data:` holds a JSON object (OpenAI's chunks end with `[DONE]`);
# Anthropic's and the Responses API's events carry an `event:` name too.
_EVENT = _object("data", event=_STR, data=_STR)


def path_parameter(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _STR,
            "description": description}  # fmt: skip


def responses(path: str, ok: str, stream: bool = False) -> dict[str, Any]:
    """The `responses` of an operation: 200 as `OK[ok]` (and SSE when `stream`), and every
    error status in the API's shape."""
    content: dict[str, Any] = {"application/json": {"schema": OK[ok]}}
    if stream:
        content["text/event-stream"] = {"schema": _EVENT}
    error = ANTHROPIC_ERROR if path.startswith("/v1/messages") else OPENAI_ERROR
    out: dict[str, Any] = {"200": {"description": "Successful Response", "content": content}}
    for status, text in _ERRORS.items():
        out[status] = {"description": text, "content": {"application/json": {"schema": error}}}
    if path == "/health":  # its 503 is the health answer itself, not an error
        out["503"] = {"description": "The engine stopped", "content": content}
    return out


def operation(path: str, ok: str, stream: bool = False, **parameters: str) -> dict[str, Any]:
    """`openapi_extra` for a route: its responses and its path parameters (name=description)."""
    extra: dict[str, Any] = {"responses": responses(path, ok, stream)}
    if parameters:
        extra["parameters"] = [path_parameter(n, d) for n, d in parameters.items()]
    return extra
