"""One log line per HTTP request, written when its answer has gone out (or its client has gone):
request id, method, path, status, and for a generation the model, API, prompt / cached /
completion tokens, time to first token, tokens per second and finish reason ("cancelled" for
a client that left mid-answer); for an error its message. Long prompts also log their prefill
progress, as mlx_lm.server does ("Prompt processing progress: done/total").

The request id is the client's `X-Request-Id` when it sends a usable one, else a new one; every
answer carries it back in `X-Request-Id` (and Anthropic's `request-id` on /v1/messages), which
the OpenAI and Anthropic SDKs expose as `_request_id`, so a client can name its line in the log.
"""

import asyncio
import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .errors import is_anthropic_path

log = logging.getLogger("mlxd.requests")

QUIET_PATHS = {"/health", "/metrics"}  # pollers: their successes log at DEBUG, not INFO
ERROR_BODY_MAX = 16 << 10  # bytes of an error answer read for its message
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")  # a client's id, if it is this tame


@dataclass
class RequestRecord:
    request_id: str
    method: str
    path: str
    client: str | None
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None
    error: str | None = None
    generations: list[dict[str, Any]] = field(default_factory=list)
    error_body: bytearray | None = None  # an error answer's body, read for its message

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
        }
        out.update(merged(self.generations))
        if self.error is None and self.error_body is not None:
            self.error = error_message(bytes(self.error_body))
        if self.error is not None:
            out["error"] = self.error
        out["duration_s"] = round(time.perf_counter() - self.started, 3)
        out["client"] = self.client
        return out


_current: ContextVar[RequestRecord | None] = ContextVar("mlxd_request", default=None)


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            if _CLIENT_ID.fullmatch(text):
                return text
    return f"req_{uuid.uuid4().hex[:16]}"


def error_message(body: bytes) -> str | None:
    """The message of an error answer in either API's shape ({"error": {"message": ...}})."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return err if isinstance(err, str) else None


def summary(gen: Any) -> dict[str, Any]:
    """What a finished Generation (generation.py) adds to its request's line."""
    u = gen.usage
    reasons = list(gen.finish_reasons)
    reasons += ["cancelled"] * (len(gen.handles) - len(reasons))  # rows their client left
    seen = len(gen.gaps) + (gen.ttft_s is not None)  # tokens that reached the request
    busy = sum(gen.gaps)
    errors = [str(h.done.error) for h in gen.handles if h.done is not None and h.done.error]
    out: dict[str, Any] = {
        "model": gen.served.name,
        "api": gen.endpoint or None,
        "prompt_tokens": u.prompt_tokens,
        "cached_tokens": u.cached_tokens,
        # a cancelled row's tokens are in no usage, but its client was sent them
        "completion_tokens": max(u.completion_tokens, seen),
        "ttft_s": round(gen.ttft_s, 3) if gen.ttft_s is not None else None,
        # after the first token: decode speed as the client saw it
        "tokens_per_s": round(len(gen.gaps) / busy, 1) if busy > 0 else None,
        "finish": ",".join(r or "unknown" for r in reasons) or None,
    }
    if errors:
        out["error"] = errors[0]
    return out


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One request's generations as one set of fields (a request runs one; counts add up)."""
    if not parts:
        return {}
    out = dict(parts[0])
    for more in parts[1:]:
        for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
            out[key] += more[key]
        out["finish"] = ",".join(x for x in (out["finish"], more["finish"]) if x)
    return out


def generation_finished(gen: Any) -> None:
    """Called with every finished Generation (through metrics.Metrics.finished)."""
    record = _current.get()
    if record is not None:
        record.generations.append(summary(gen))


def text(fields: dict[str, Any]) -> str:
    """The text form: `METHOD PATH STATUS key=value ...` (logfmt: values with spaces quoted)."""
    head = f"{fields['method']} {fields['path']} {fields['status']}"
    rest = [
        f"{k}={_value(v)}"
        for k, v in fields.items()
        if k not in ("method", "path", "status") and v is not None
    ]
    return " ".join([head, *rest])


def _value(v: Any) -> str:
    s = str(v)
    return json.dumps(s, ensure_ascii=False) if not s or re.search(r'[\s"=]', s) else s


def emit(record: RequestRecord) -> None:
    fields = record.fields()
    quiet = record.path in QUIET_PATHS and (record.status or 0) < 400
    log.log(logging.DEBUG if quiet else logging.INFO, text(fields), extra={"fields": fields})


class PrefillProgress:
    """A row's `prompt_progress_callback` (called on the engine thread after each prefill
    chunk): logs `Prompt processing progress: done/total` for prompts whose prefill takes more
    than one chunk; a prompt (or the part of it not cached) done in one chunk logs nothing."""

    def __init__(self, rid: str) -> None:
        self.rid, self.logged, self.over = rid, False, False

    def __call__(self, done: int, total: int) -> None:
        if self.over or done <= 0:
            return
        self.over = done >= total
        # more than the last token left after this chunk: another chunk follows
        if self.logged or total - done > 1:
            self.logged = True
            fields = {"request_id": self.rid, "prompt_done": done, "prompt_total": total}
            msg = f"Prompt processing progress: {done}/{total} request_id={self.rid}"
            log.info(msg, extra={"fields": fields})


def prefill_progress() -> PrefillProgress | None:
    """The progress logger for a row of the request being handled (None outside one)."""
    record = _current.get()
    return PrefillProgress(record.request_id) if record is not None else None


class RequestLogMiddleware:
    """Pure ASGI (a BaseHTTPMiddleware would buffer streams). The record is in a context
    variable, so the Generation of the same request (same task or its children) finds it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = scope.get("client")
        record = RequestRecord(
            request_id(scope.get("headers", [])),
            scope.get("method", ""),
            scope.get("path", ""),
            f"{client[0]}:{client[1]}" if client else None,
        )
        rid = record.request_id.encode("latin-1")

        async def logging_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", rid)]
                if is_anthropic_path(record.path):
                    headers.append((b"request-id", rid))
                message = {**message, "headers": headers}
                if record.status >= 400:
                    record.error_body = bytearray()
            elif message["type"] == "http.response.body" and record.error_body is not None:
                room = ERROR_BODY_MAX - len(record.error_body)
                record.error_body += message.get("body", b"")[: max(room, 0)]
            await send(message)

        token = _current.set(record)
        try:
            await self.app(scope, receive, logging_send)
        except Exception as e:  # past every handler: the server answers 500
            if record.status is None:
                record.status, record.error = 500, f"{type(e).__name__}: {e}"
            raise
        finally:
            _current.reset(token)
            if record.status is None:  # the client left before any answer began
                record.status = 499
            # Written on the loop's next turn: rows cancelled for a client that left (their
            # task's cancel is queued already) report their tokens and reason first.
            asyncio.get_running_loop().call_soon(emit, record)
