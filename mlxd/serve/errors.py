"""Errors in each API's own shape: OpenAI's `{"error": {message, type, param, code}}` and
Anthropic's `{"type": "error", "error": {type, message}}`; 429/503 carry Retry-After. Reading a
request body: a size cap (413), JSON (400 naming the problem), an object (400)."""

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

# HTTP status -> (OpenAI error type, Anthropic error type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    411: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    502: ("server_error", "api_error"),  # an engine process died under the request
    503: ("server_error", "overloaded_error"),
}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def openai_body(err: APIError) -> dict:
    kind = _TYPES.get(err.status, ("invalid_request_error", ""))[0]
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_body(err: APIError) -> dict:
    kind = _TYPES.get(err.status, ("", "invalid_request_error"))[1]
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(err: APIError, path: str) -> JSONResponse:
    body = anthropic_body(err) if is_anthropic_path(path) else openai_body(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, within the server's `--max-request-bytes`."""
    limit = request.app.state.mlxd.config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    request.scope.setdefault("state", {})["body_bytes"] = size  # limits.ReleaseAfterLargeBodies
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise bad_request(f"Invalid JSON in request body: {e}") from e
    except RecursionError as e:
        raise bad_request("request body nests too deeply") from e
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    check_values(body)
    return body


INT64 = 1 << 63  # MLX and the samplers take 64-bit integers at most
MAX_DEPTH = 100  # a JSON schema nests a few dozen levels; copies and templates recurse per level


def check_values(body: dict[str, Any]) -> None:
    """Every string valid UTF-8 (JSON's `\\ud800` escapes decode to lone surrogates, which no
    tokenizer or response can encode), every integer within 64 bits, every float finite
    (json.loads takes NaN and Infinity), nesting within MAX_DEPTH: else a 400 naming where."""
    stack: list[tuple[str, Any, int]] = [("", body, 0)]
    while stack:
        where, value, depth = stack.pop()
        if depth > MAX_DEPTH and isinstance(value, (dict, list)):
            raise bad_request(f"{where}: nested deeper than {MAX_DEPTH} levels", _field(where))
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not -INT64 <= value < INT64:
            raise bad_request(f"{where}: the integer {value} is out of range", _field(where))
        elif isinstance(value, float) and not math.isfinite(value):
            raise bad_request(f"{where}: {value} is not a finite number", _field(where))
        elif isinstance(value, dict):
            for k, v in value.items():
                _check_text(k, where or "body")  # a key is checked before it names a place
                stack.append((f"{where}.{k}" if where else k, v, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        message = f"{where}: the text holds a lone surrogate (invalid Unicode)"
        raise bad_request(message, _field(where)) from None


def _field(where: str) -> str:
    """The top-level field a JSON path is in: the `param` of OpenAI's errors."""
    return re.split(r"[.\[]", where, maxsplit=1)[0]
