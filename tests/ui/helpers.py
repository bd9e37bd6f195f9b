"""A tiny server for the page tests: the real page routes (mlxd.serve.ui) and a fake API whose
chat stream is fed frame by frame by the test, so rendering, Stop and disconnects are seen as
they happen. Canned SSE bodies for `page.route` too."""

import asyncio
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from mlxd.serve import ui

MODELS = [
    {"id": "tiny-base", "object": "model", "state": "loaded"},
    {"id": "tiny-lora", "object": "model", "parent": "tiny-base"},
    {"id": "other", "object": "model", "state": "unloaded"},
]


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def delta(content: str = "", **fields: Any) -> str:
    """One chunk frame; extra fields (reasoning, reasoning_content) go into the delta."""
    d = {"content": content, **fields} if content else dict(fields)
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]})


def finish(reason: str = "stop") -> str:
    return sse({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})


def usage(prompt: int, completion: int, cached: int = 0) -> str:
    u: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    u["total_tokens"] = prompt + completion
    u["prompt_tokens_details"] = {"cached_tokens": cached}
    return sse({"object": "chat.completion", "choices": [], "usage": u})


DONE = "data: [DONE]\n\n"


def canned(*frames: str) -> str:
    """A whole SSE body for `route.fulfill`."""
    return "".join(frames)


@dataclass
class FakeAPI:
    """The fake endpoints' state: feed `frames` (None ends the stream); `bodies` and `auth` are
    what the page sent; `disconnected` is set when the page dropped a stream before its end."""

    api_key: str | None = None
    frames: "queue.Queue[str | None]" = field(default_factory=queue.Queue)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)

    def denied(self, request: Request) -> JSONResponse | None:
        self.auth.append(request.headers.get("authorization", ""))
        if self.api_key is None or self.auth[-1] == f"Bearer {self.api_key}":
            return None
        err = {"error": {"message": "missing or invalid API key", "type": "authentication_error"}}
        return JSONResponse(err, status_code=401)

    def app(self) -> FastAPI:
        app = FastAPI()
        ui.add_routes(app)

        @app.get("/v1/models")
        async def models(request: Request):
            return self.denied(request) or {"object": "list", "data": MODELS}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            if (refused := self.denied(request)) is not None:
                return refused
            self.bodies.append(await request.json())
            return StreamingResponse(self._stream(), media_type="text/event-stream")

        return app

    async def _stream(self):
        finished = False
        try:
            while True:
                try:
                    frame = await asyncio.to_thread(self.frames.get, True, 0.05)
                except queue.Empty:
                    yield ": keepalive\n\n"  # as the server does in a long prefill
                    continue
                if frame is None:
                    finished = True
                    return
                yield frame
        finally:
            if not finished:
                self.disconnected.set()


class TinyServer:
    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the page test server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(name="fake_site")
def fake_site_fixture() -> Iterator[tuple[FakeAPI, TinyServer]]:
    """The fake API and its server (per test: each test feeds its own frames)."""
    fake = FakeAPI()
    server = TinyServer(fake.app())
    yield fake, server
    fake.frames.put(None)  # a stream still waiting ends
    server.stop()


def open_chat(page: Any, url: str) -> None:
    """Loads the page and waits until the model list and the stored conversations are in."""
    page.set_default_timeout(10_000)
    page.goto(url + "/")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    page.wait_for_selector("body[data-loaded]", state="attached")


def send(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def fulfill_sse(page: Any, *bodies: str) -> list[dict[str, Any]]:
    """Answers each chat request with the next canned SSE body (the last one repeats); returns
    the list the request bodies are appended to."""
    seen: list[dict[str, Any]] = []

    def handle(route: Any) -> None:
        seen.append(route.request.post_data_json)
        body = bodies[min(len(seen), len(bodies)) - 1]
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    page.route("**/v1/chat/completions", handle)
    return seen


def wait_idle(page: Any) -> None:
    """Until the reply has ended (the Send button is back)."""
    page.wait_for_selector("#send:not([hidden])")
    page.wait_for_selector(".msg.assistant:not(.streaming)")


def wait_reply_text(page: Any, text: str) -> None:
    """Until the last reply's text is `text` (while it streams)."""
    last = "[...document.querySelectorAll('.msg.assistant .content')].pop()"
    js = f"t => {last}.textContent.trim() === t"
    page.wait_for_function(js, arg=text)
