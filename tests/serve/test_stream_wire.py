"""The streaming hot path: frames already due go out in one write while the reader is behind,
one wake-up per event loop per batched step, and uvicorn's loop / HTTP parser flags."""

import asyncio
import json
import threading
from typing import Any

import pytest

from mlxd.engine.request import DoneEvent, RequestHandle, TokenEvent, wake
from mlxd.serve.streaming import coalesce, sse_data, sse_event


async def _frames(items: list[str], closed: list[bool]):
    try:
        for item in items:
            yield item
    finally:
        closed.append(True)


async def _collect(agen) -> list[str]:
    return [x async for x in agen]


def test_frames_are_joined_only_while_the_reader_is_behind() -> None:
    behind = iter([True, True, False, True, False])  # asked once per frame
    closed: list[bool] = []
    out = asyncio.run(_collect(coalesce(_frames(list("abcde"), closed), lambda: next(behind))))
    assert out == ["abc", "de"]
    assert closed == [True]


def test_held_frames_are_flushed_when_the_frames_end() -> None:
    closed: list[bool] = []
    out = asyncio.run(_collect(coalesce(_frames(list("xyz"), closed), lambda: True)))
    assert out == ["xyz"]


def test_an_abandoned_stream_closes_its_frames_at_once() -> None:
    """A client gone away closes the outer stream; the frames (which cancel the rows on close)
    must be closed then, not whenever the garbage collector gets to them."""
    closed: list[bool] = []

    async def main() -> None:
        outer = coalesce(_frames(list("abc"), closed), lambda: False)
        assert await outer.__anext__() == "a"
        await outer.aclose()
        assert closed == [True]  # now, before asyncio.run's own clean-up of generators

    asyncio.run(main())


class _Loop:
    def __init__(self) -> None:
        self.calls = 0

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls += 1
        fn(*args)


class _Closed:
    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        raise RuntimeError("Event loop is closed")


def test_one_wake_up_per_event_loop_for_a_whole_step() -> None:
    loop_a, loop_b = _Loop(), _Loop()
    flags = [asyncio.Event() for _ in range(4)]
    watchers = [(loop_a, flags[0]), (loop_a, flags[1]), (loop_b, flags[2]), (loop_a, flags[3])]
    wake(watchers + [(_Closed(), asyncio.Event())])  # a closed loop is skipped, not raised
    assert (loop_a.calls, loop_b.calls) == (1, 1)
    assert all(f.is_set() for f in flags)


def test_quiet_puts_reach_an_async_reader_after_one_wake() -> None:
    """The batched step's path: put_quiet for every row, then one wake per loop."""
    handles = [RequestHandle() for _ in range(3)]

    async def read(h: RequestHandle) -> list[int]:
        return [ev.token async for ev in h]

    async def main() -> list[list[int]]:
        readers = [asyncio.create_task(read(h)) for h in handles]
        await asyncio.sleep(0.01)  # the readers are waiting on their flags

        def engine() -> None:
            for step in range(5):
                watchers = []
                for h in handles:
                    assert not h.pending() or step > 0
                    watchers += h.put_quiet(TokenEvent(step, None))
                    if step == 4:
                        watchers += h.put_quiet(DoneEvent("length"))
                wake(watchers)

        threading.Thread(target=engine).start()
        return await asyncio.wait_for(asyncio.gather(*readers), timeout=10)

    assert asyncio.run(main()) == [[0, 1, 2, 3, 4]] * 3
    assert all(not h.pending() and h.done.reason == "length" for h in handles)


@pytest.mark.parametrize("loop,http", [("asyncio", "h11"), ("uvloop", "httptools")])
def test_serve_passes_the_loop_and_the_http_parser_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch, qwen3_model_dir: Any, tmp_path: Any, loop: str, http: str
) -> None:
    import uvicorn

    from mlxd.cli.serve import parse_config
    from mlxd.serve.main import serve

    seen: list[Any] = []

    def run(server: Any) -> None:  # instead of listening: what it was configured with
        seen.append(server.config)
        server.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run)
    config = parse_config(
        ["--model", str(qwen3_model_dir), "--data-dir", str(tmp_path), "--loop", loop,
         "--http", http]
    )  # fmt: skip
    serve(config)
    assert seen[0].loop == loop
    parser = seen[0].http  # the parser's protocol class, behind the head deadline's mixin
    assert ("H11" if http == "h11" else "HttpTools") in "".join(c.__name__ for c in parser.__mro__)


def test_frames_are_json_dumps_bytes_without_ascii_escapes() -> None:
    obj = {"delta": {"content": 'héllo \u2603 "q" \n'}, "n": [1, 2.5, None, True], "e": {}}
    text = json.dumps(obj, ensure_ascii=False)
    assert sse_data(obj) == f"data: {text}\n\n"
    assert sse_event("message_delta", obj) == f"event: message_delta\ndata: {text}\n\n"
    assert "\\u" not in sse_data(obj)  # non-ASCII sent as is, as mlx_lm.server does
