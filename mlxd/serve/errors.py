"""Errors in each API's own shape: OpenAI's `{"error": {message, type, param, code}}` and
Anthropic's `{"type": "error", "error": {type, message}}`; 429/503 carry Retry-After."""

from dataclasses import dataclass, field

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
