"""`--step-order thread` through the real server (engine/overlap.py): concurrent OpenAI SDK
streams, twice (the second round's prompts come from the prefix store), get the same text,
chunks and finish as the server in mlx-lm's order; a row failing mid-stream ends with its error
and the server keeps serving."""

import asyncio
import sys
from collections.abc import Callable

import pytest
from test_held_wake import _streams


@pytest.fixture
def interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def _two_rounds(url: str) -> list[list[tuple[str, int, str | None]]]:
    return [asyncio.run(_streams(url)), asyncio.run(_streams(url))]


def test_thread_order_streams_the_same_chunks(
    make_server: Callable[..., object], interval, monkeypatch
) -> None:
    from mlxd.engine import overlap

    jobs: list[int] = []
    real = overlap.StepEncoder.step
    monkeypatch.setattr(overlap.StepEncoder, "step", lambda s, *a: (jobs.append(1), real(s, *a))[1])
    monkeypatch.setenv("MLXD_THREAD_ROWS", "2")  # six streams: the encoder takes their steps
    plain = make_server(batch=8)
    want = _two_rounds(plain.v1)  # type: ignore[attr-defined]
    plain.stop()  # type: ignore[attr-defined]
    assert jobs == []
    threaded = make_server(batch=8, step_order="thread", switch_interval="engine")
    engine = threaded.state.provider.default.engine  # type: ignore[attr-defined]
    assert engine.config.step_order == "thread"
    got = _two_rounds(threaded.v1)  # type: ignore[attr-defined]
    assert got == want
    assert all(text and finish == "length" for rnd in got for text, _, finish in rnd)
    assert len(jobs) >= 10  # steps were read and queued on the encoder's thread
    stats = engine.stats()
    assert stats["active"] == stats["waiting"] == 0


def test_a_row_failing_mid_stream_ends_alone_and_the_server_goes_on(
    make_server: Callable[..., object], rows_fail_mid_stream, interval, monkeypatch
) -> None:
    from openai import OpenAI

    monkeypatch.setenv("MLXD_THREAD_ROWS", "1")
    live = make_server(batch=8, step_order="thread")
    client = OpenAI(base_url=live.v1, api_key="x")  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="boom in the row"):
        client.chat.completions.create(
            model="default_model", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    rows_fail_mid_stream()  # undo: the next requests run clean
    got = asyncio.run(_streams(live.v1))  # type: ignore[attr-defined]
    assert all(text and finish == "length" for text, _, finish in got)
