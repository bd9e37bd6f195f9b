"""What every answer to a hostile request must be: never a 5xx, every 4xx JSON in its API's
error shape (OpenAI's `{"error": {message, type, param, code}}`; Anthropic's
`{"type": "error", "error": {type, message}}` on /v1/messages*), and no stream that carries an
error frame (a failure the status line hid)."""

import json
from typing import Any


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_shape_problem(path: str, body: Any) -> str | None:
    """Why `body` is not an error in `path`'s API shape, or None."""
    if is_anthropic(path):
        ok = (
            isinstance(body, dict)
            and body.get("type") == "error"
            and isinstance(body.get("error"), dict)
            and set(body["error"]) == {"type", "message"}
            and isinstance(body["error"]["type"], str)
        )
        message = body["error"]["message"] if ok else None
    else:
        err = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err)
        message = err["message"] if ok else None
    if not ok:
        return "not an error in the API's shape"
    if not isinstance(message, str) or not message:
        return "an error without a message"
    return None


def _error_type(data: dict[str, Any]) -> str | None:
    """The error type an SSE data frame carries (OpenAI's or Anthropic's error, a failed
    Response's error code), or None when it carries none."""
    if data.get("type") == "response.failed":
        return str(((data.get("response") or {}).get("error") or {}).get("code"))
    if isinstance(data.get("error"), dict):
        return str(data["error"].get("type"))
    return "error" if data.get("type") == "error" else None


def _frames(text: str) -> list[dict[str, Any] | None]:
    """Each `data: {...}` line's JSON (None where it is not JSON). Lines end at "\n" only:
    JSON text may hold U+2028, which str.splitlines() would split on."""
    out: list[dict[str, Any] | None] = []
    for line in text.split("\n"):
        if line.startswith("data: {"):
            try:
                out.append(json.loads(line[6:]))
            except ValueError:
                out.append(None)
    return out


def stream_refused(text: str) -> bool:
    """The stream ended with a rate-limit error frame: a 429 (--request-timeout before the
    first token) whose status line had already gone out as 200."""
    return any(f is not None and _error_type(f) == "rate_limit_error" for f in _frames(text))


def stream_problem(text: str) -> str | None:
    """An error frame in a 200 stream (OpenAI's error data, Anthropic's error event, a failed
    Response) other than a rate-limit refusal, a frame that is not JSON, or a stream that did
    not finish."""
    for frame in _frames(text):
        if frame is None:
            return "the stream carries a data line that is not JSON"
        kind = _error_type(frame)
        if kind not in (None, "rate_limit_error"):
            return f"the stream carries an error frame ({kind})"
    done = ("data: [DONE]", "event: message_stop", "event: response.completed",
            "event: response.incomplete", "event: response.failed", "event: error")  # fmt: skip
    if not any(mark in text for mark in done):
        return "the stream did not finish"
    return None


def problem(path: str, status: int, content_type: str, text: str) -> str | None:
    """Why this answer to a hostile request to `path` is wrong, or None."""
    if status >= 500 and not (path == "/health" and status == 503):
        return f"{status}"
    if 400 <= status < 500:
        if not content_type.startswith("application/json"):
            return f"a {status} that is not JSON ({content_type})"
        try:
            body = json.loads(text)
        except ValueError:
            return f"a {status} whose body is not JSON"
        why = error_shape_problem(path, body)
        return f"a {status}: {why}" if why else None
    if content_type.startswith("text/event-stream"):
        return stream_problem(text)
    return None


def describe(method: str, path: str, body: Any, status: int | str, text: str) -> str:
    """One line that reproduces the case: the request as sent, and the answer's start."""
    sent = "" if body is None else json.dumps(body)[:200_000]  # whole, to replay it
    tail = f" ... {text[-400:]}" if len(text) > 800 else text[400:]
    return f"{method} {path} {sent} -> {status}: {text[:400]}{tail}"
