"""While an `exclusive` job runs, new inference is a 503 with Retry-After (the job has the
machine); everything else (jobs, models, health, the pages) keeps answering."""

import json

from ..errors import APIError, anthropic_body, is_anthropic_path, openai_body
from .manager import RETRY_S

INFERENCE = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/v1/messages",
             "/v1/responses", "/v1/embeddings")  # fmt: skip


class ExclusiveJobGate:
    def __init__(self, app, state) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        jobs = self.state.jobs
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in INFERENCE:
            return await self.app(scope, receive, send)
        if jobs is None or (job := jobs.exclusive()) is None:
            return await self.app(scope, receive, send)
        err = APIError(
            503, f"an exclusive job ({job.id}) is running; inference resumes when it ends"
        )
        body = json.dumps(anthropic_body(err) if is_anthropic_path(path) else openai_body(err))
        headers = [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_S).encode())]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})
