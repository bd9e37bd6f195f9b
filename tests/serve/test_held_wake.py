"""`--switch-interval engine` through the real server: a batched step's readers are woken as
the next step is queued (engine/overlap.py's HeldWake). Concurrent streams through the official
OpenAI SDK get every chunk, and the same text and finish as the server without the flag."""

import asyncio
import sys
from collections.abc import Callable

import pytest

PROMPTS = [f"agent {i}: tell me about the number {i * 7}" for i in range(6)]


@pytest.fixture
def interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


async def _streams(url: str) -> list[tuple[str, int, str | None]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="x")

    async def one(prompt: str) -> tuple[str, int, str | None]:
        stream = await client.chat.completions.create(
            model="default_model",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=14,
            temperature=0,
            stream=True,
        )
        text, chunks, finish = "", 0, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
                chunks += 1
        return text, chunks, finish

    try:
        return list(await asyncio.gather(*(one(p) for p in PROMPTS)))
    finally:
        await client.close()


def test_engine_phases_stream_every_chunk_with_the_same_text(
    make_server: Callable[..., object], interval, monkeypatch
) -> None:
    from mlxd.engine import overlap

    held: list[int] = []  # readers in each held wake-up released (inside the next step)
    real = overlap.wake
    monkeypatch.setattr(overlap, "wake", lambda w: (held.append(len(w)), real(w)))
    plain = make_server(batch=8)
    want = asyncio.run(_streams(plain.v1))  # type: ignore[attr-defined]
    plain.stop()  # type: ignore[attr-defined]
    assert held == []  # without the flag nothing is held
    phased = make_server(batch=8, switch_interval="engine")
    engine = phased.state.provider.default.engine  # type: ignore[attr-defined]
    assert engine.phases is not None and engine.config.gil_phases
    got = asyncio.run(_streams(phased.v1))  # type: ignore[attr-defined]
    assert got == want  # text, chunk count (a partial UTF-8 token sends none) and finish
    assert all(text and finish == "length" and chunks > 1 for text, chunks, finish in got)
    assert len(held) >= 8 and all(n > 0 for n in held)  # the streams were woken by held wake-ups
