"""A row's failure is the row's, through the server: a request whose prompt makes the model
raise while other streams decode beside it gets the error frame; the others stream on to their
normal finish, with the text they get when it never came (engine/generator.py)."""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

GOOD = ["tell me about the sea", "count some numbers for me", "describe a small town"]
BAD = "zebra okapi giraffe"


@contextmanager
def poisoned(model: Any, token: int) -> Iterator[None]:
    """The model raises on a prefill chunk holding `token` (decode steps are left alone)."""
    emb = model.model.embed_tokens
    clean = type(emb)

    class Poisoned(clean):  # type: ignore[misc, valid-type]
        def __call__(self, x: mx.array) -> mx.array:
            if x.shape[-1] > 1 and token in x.flatten().tolist():
                raise RuntimeError("a poisoned prompt")
            return super().__call__(x)

    emb.__class__ = Poisoned
    try:
        yield
    finally:
        emb.__class__ = clean


async def _streams(url: str, bad: bool) -> list[tuple[str, str | None, str | None]]:
    """The good streams, and once each has its first chunk (they decode as a batch) the bad
    one: (text, finish, error) each."""
    from openai import APIError, AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="x")
    started = [asyncio.Event() for _ in GOOD]

    async def one(prompt: str, first: asyncio.Event | None) -> tuple[str, str | None, str | None]:
        text, finish = "", None
        try:
            stream = await client.chat.completions.create(
                model="default_model",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=96,
                temperature=0,
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
                    if first is not None:
                        first.set()
        except APIError as e:
            return text, finish, e.message
        return text, finish, None

    async def late() -> tuple[str, str | None, str | None]:
        await asyncio.gather(*(e.wait() for e in started))
        return await one(BAD, None)

    try:
        runs = [one(p, e) for p, e in zip(GOOD, started, strict=True)]
        return list(await asyncio.gather(*runs, *([late()] if bad else [])))
    finally:
        await client.close()


def test_only_the_failing_stream_gets_the_error_frame(make_server: Callable[..., Any]) -> None:
    live = make_server(batch=8)
    served = live.state.provider.default
    tok = served.tokenizer
    clean = {t for text in [*GOOD, "user assistant system"] for t in tok.encode(text)}
    token = min(set(tok.encode(BAD)) - clean)  # in the bad prompt only
    with poisoned(served.model, token):
        *good, bad = asyncio.run(_streams(live.v1, bad=True))
    assert bad[2] is not None and "a poisoned prompt" in bad[2]
    assert [(finish, error) for _, finish, error in good] == [("length", None)] * 3
    assert asyncio.run(_streams(live.v1, bad=False)) == good  # the same text without it
    stats = served.engine.stats()
    assert stats["active"] == stats["waiting"] == 0
