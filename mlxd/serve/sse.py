"""Server-sent events: `data: {json}` frames (OpenAI) and named events (Anthropic, Responses)."""

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# json.dumps builds a new encoder on every call with non-default options; one reused encoder
# gives the same bytes ~1.6 us sooner a frame (32 streams send a frame each every step).
_JSON = json.JSONEncoder(ensure_ascii=False)


def data(obj: Any) -> str:
    return f"data: {_JSON.encode(obj)}\n\n"


def event(name: str, obj: Any) -> str:
    return f"event: {name}\ndata: {_JSON.encode(obj)}\n\n"


def stream(
    frames: AsyncIterator[str], behind: Callable[[], bool] | None = None
) -> StreamingResponse:
    """`behind()`: more tokens are already waiting. Then the frames made so far go out with the
    next ones in one write: the same frames, fewer sends when the server is busy."""
    body = frames if behind is None else coalesce(frames, behind)
    return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)


async def coalesce(frames: AsyncIterator[str], behind: Callable[[], bool]) -> AsyncIterator[str]:
    held: list[str] = []
    try:
        async for frame in frames:
            held.append(frame)
            if not behind():
                yield "".join(held)
                held.clear()
        if held:
            yield "".join(held)
    finally:  # a client gone away: close the frames now, which cancels the rows
        await frames.aclose()  # type: ignore[attr-defined]
