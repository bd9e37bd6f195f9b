"""The request body's deadline, as ASGI middleware around the whole app: a body that makes no
progress for `body_timeout` seconds is answered 408 and its connection closed, and a client
that hangs up mid-body ends its request quietly (Starlette raises ClientDisconnect to the
handler reading the body, which the app's catch-all would log as a crash)."""

import asyncio
import logging
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .errors import APIError, error_response

log = logging.getLogger("mlxd.serve")

DISCONNECT = {"type": "http.disconnect"}


class BodyDeadline:
    def __init__(self, app: Any, body_timeout: float) -> None:
        self.app, self.timeout = app, body_timeout
        self.timed_out = 0  # bodies that stalled (tests, logs)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_done = started = answered = False  # answered: a 408 went out, the app's is dropped

        async def timed_receive() -> Any:
            nonlocal body_done, answered
            if answered:
                return DISCONNECT
            if body_done:  # after the body, a receive waits for the client to hang up
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                self.timed_out += 1
                log.debug("closed a connection whose request body stalled")
                if not started:
                    answered = True
                    err = APIError(408, "the request body stalled", headers={"Connection": "close"})
                    await error_response(err, scope["path"])(scope, receive, send)
                return DISCONNECT
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if not answered:
                started = True
                await send(message)

        await self.app(scope, timed_receive, guarded_send)


async def quiet_disconnect(request: Request, exc: Exception) -> Response:
    """A client that hung up while its body was read: nobody reads a reply, nothing to log."""
    assert isinstance(exc, ClientDisconnect)
    return Response(status_code=499)


def harden(app: Any, body_timeout: float) -> BodyDeadline:
    """`app` (FastAPI) with the body deadline around it and quiet mid-body hang-ups."""
    app.add_exception_handler(ClientDisconnect, quiet_disconnect)
    return BodyDeadline(app, body_timeout)
