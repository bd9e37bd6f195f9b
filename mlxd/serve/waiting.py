"""A non-streaming response computed while watching the connection: a client that hangs up
cancels its rows, so their KV is freed instead of finishing work nobody will read."""

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")


async def until_done_or_disconnect(request: Request, work: Awaitable[T], gen: Any) -> T | Response:
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                gen.cancel()
                task.cancel()
                return Response(status_code=499)  # nobody reads it; no traceback in the log
    finally:
        if not task.done():
            task.cancel()
