"""`--api-key`: every endpoint but /health needs `Authorization: Bearer KEY` or Anthropic's
`x-api-key: KEY`; a wrong or missing key is a 401 in the API's shape. CORS preflights pass."""

import hmac
import json

from .errors import APIError, anthropic_body, is_anthropic_path, openai_body

OPEN_PATHS = {"/health"}


class APIKeyMiddleware:
    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key

    def _presented(self, headers: dict[bytes, bytes]) -> str | None:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        key = headers.get(b"x-api-key")
        return key.decode("latin-1").strip() if key is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = self._presented(headers)
        if given is not None and hmac.compare_digest(given.encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        err = APIError(401, "missing or invalid API key")
        path = scope["path"]
        body = json.dumps(anthropic_body(err) if is_anthropic_path(path) else openai_body(err))
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer")],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body.encode()})
