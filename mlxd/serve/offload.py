"""Blocking work (tokenizing, templating, submitting arrays) off the event loop, on mlxd's
pooled threads that never exit (a finished thread that touched MLX can abort the process)."""

import asyncio
from collections.abc import Callable
from typing import TypeVar

from ..engine.threads import run_soon

T = TypeVar("T")


async def offload(fn: Callable[[], T]) -> T:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, e)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    run_soon(job)
    return await future


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
