"""Admission and overload: a full queue is a 429 with Retry-After (the queue's drain), a
burst of batch + max_queue is served, budgets and the context length refuse what can never
fit (400 naming the limit), a memory budget below the weights fails at start-up, and a client
that goes away, on any route, frees its row quietly."""

import json
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from serve.conftest import server_args

from mlxd.config import EngineConfig
from mlxd.engine import Overloaded
from mlxd.engine.admission import Admission
from mlxd.engine.request import GenerationRequest, RequestHandle
from mlxd.model import ModelLoadError
from mlxd.serve.generation import retry_after
from mlxd.serve.main import make_state

MESSAGES = [{"role": "user", "content": "Tell me a story."}]
NO_EOS = {"151643": -100, "151645": -100}  # Qwen3's end tokens: rows run to max_tokens
CONTEXT = 64  # max_position_embeddings of the small-context copy of the tiny model
HI = 6023  # Qwen3's id for "hi"


def stats(live) -> dict:
    return live.state.provider.default.engine.stats()


def wait_for(cond: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.05)


def data_frames(lines) -> list[dict]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def finish_of(frames: list[dict]) -> str | None:
    return next(
        (c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]), None
    )


def test_full_queue_is_429_with_retry_after(make_server) -> None:
    live = make_server(batch=1, max_queue=1)
    url = live.v1 + "/chat/completions"
    long = {"messages": MESSAGES, "max_tokens": 60, "logit_bias": NO_EOS, "stream": True}
    short = {**long, "max_tokens": 4}
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        with a.stream("POST", url, json=long) as ra:
            a_lines = ra.iter_lines()
            # The second request goes out once the first is running, not while it may still
            # sit in the queue (then the queue of one is full and the second is refused).
            first = [next(x for x in a_lines if x.startswith("data: "))]
            with b.stream("POST", url, json=short) as rb:
                assert rb.status_code == 200
                wait_for(lambda: stats(live)["waiting"] == 1, 5, "the second request did not queue")
                assert stats(live)["active"] == 1
                rc = httpx.post(url, json={**short, "stream": False}, timeout=30)
                assert stats(live)["active"] == 1, "the first row ended before the third request"
                assert rc.status_code == 429, rc.text
                assert int(rc.headers["retry-after"]) >= 1
                err = rc.json()["error"]
                assert err["type"] == "rate_limit_error" and "max_queue" in err["message"]
                a_frames = data_frames(first + list(a_lines))
                b_frames = data_frames(rb.iter_lines())
    assert finish_of(a_frames) == "length" and finish_of(b_frames) == "length"
    assert sum(len(c["delta"].get("content", "")) > 0 for f in b_frames for c in f["choices"])
    wait_for(lambda: stats(live)["active"] == 0, 5, "rows still active after both finished")


def test_retry_after_is_the_queues_drain_at_the_recent_rate() -> None:
    """Retry-After: the seconds the waiting requests need to get rows at the rate requests got
    rows over the last minute, whole, within [1, 60] (a fake clock: no timing)."""
    now = [1000.0]
    queue = Admission(2, 3, None, None, EngineConfig(), clock=lambda: now[0])
    rows: list = []
    queue.running = lambda: rows
    assert queue.drain_s() is None and retry_after(queue.drain_s()) == 1  # nobody waits

    def take() -> None:
        rows.extend(h for _, h in queue.take(lambda: rows, False))

    queue.push(_waiting(2))
    take()  # two rows at t=1000
    now[0] = 1010.0
    queue.push(_waiting(3))  # no free row: three may wait (max_queue)
    with pytest.raises(Overloaded):
        queue.push(_waiting(1))
    assert queue.drain_s() == pytest.approx(15.0)  # 3 waiting at 2 rows / 10 s
    assert retry_after(queue.drain_s()) == 15
    rows.pop()
    now[0] = 1020.0
    take()  # a third row at t=1020: 3 rows / 20 s, 2 still waiting
    assert retry_after(queue.drain_s()) == 14  # 13.3 s, rounded up
    now[0] = 1079.0
    assert retry_after(queue.drain_s()) == 60  # 2 / (3 rows / 79 s) = 52.7 s: up to 60
    now[0] = 1081.0  # the t=1000 rows are older than the minute: 1 row / 61 s
    assert retry_after(queue.drain_s()) == 60  # 122 s: capped
    now[0] = 1200.0  # nobody got a row in the last minute
    assert queue.drain_s() == float("inf") and retry_after(queue.drain_s()) == 60
    rows.clear()
    take()  # a burst of rows at once: the rate's span is at least a second
    queue.push(_waiting(1))
    assert retry_after(queue.drain_s()) == 1


def _waiting(n: int) -> list:
    return [(GenerationRequest(prompt=mx.array([1, 2]), max_tokens=4), RequestHandle())
            for _ in range(n)]  # fmt: skip


def test_a_burst_of_batch_plus_max_queue_is_served(make_server) -> None:
    """A burst's first wave waits in the queue while the join window holds it for a request
    still on its way (here: one whose body stalls); its rows are free, so batch + max_queue
    requests are all served and only the next one is a 429."""
    live = make_server(batch=2, max_queue=1, join_window=2)
    url = live.v1 + "/completions"
    on_its_way = socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    on_its_way.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Length: 20\r\n\r\n{")  # fmt: skip
    wait_for(lambda: live.state.provider.arrivals.pending == 1, 5, "no request on its way")
    replies: list[httpx.Response] = []

    def post(prompt: str) -> None:  # different prompts: none waits for another's prefix
        replies.append(httpx.post(url, json={"prompt": prompt, "max_tokens": 4}, timeout=60))

    burst = [threading.Thread(target=post, args=(f"turn {i}",)) for i in range(2 + 1)]
    for t in burst:
        t.start()
    wait_for(lambda: stats(live)["waiting"] == 3, 10, "the burst did not queue")
    extra = httpx.post(url, json={"prompt": "one too many", "max_tokens": 4}, timeout=30)
    assert extra.status_code == 429, extra.text
    on_its_way.sendall(b"}" * 19)  # its body ends (a 400): the wave goes
    for t in burst:
        t.join()
    on_its_way.close()
    assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]


def test_queued_client_that_leaves_frees_its_slot(make_server) -> None:
    live = make_server(batch=1, max_queue=1)
    url = live.v1 + "/chat/completions"
    long = {"messages": MESSAGES, "max_tokens": 2000, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream("POST", url, json=long, timeout=60) as ra:
        next(x for x in ra.iter_lines() if x.startswith("data: "))
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url, json={**long, "stream": False}, timeout=1.0)
        wait_for(lambda: stats(live)["waiting"] == 0, 5, "the abandoned request kept its slot")
        assert stats(live)["active"] == 1
        # The slot is free again: another request queues instead of getting a 429.
        with httpx.stream("POST", url, json={**long, "max_tokens": 2}, timeout=60) as rb:
            assert rb.status_code == 200
    wait_for(lambda: stats(live)["active"] == 0, 5, "the closed stream's row kept running")


def test_kv_budget_too_small_is_400_naming_it(make_server) -> None:
    live = make_server(kv_budget=4096)
    r = httpx.post(
        live.v1 + "/chat/completions", json={"messages": MESSAGES, "max_tokens": 8}, timeout=30
    )
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "kv_budget" in message and "4096" in message
    assert stats(live)["active"] == 0 and stats(live)["waiting"] == 0


def test_memory_budget_below_the_weights_fails_at_start(qwen3_model_dir: Path, tmp_path) -> None:
    args = server_args(model=str(qwen3_model_dir), memory_budget="1MB", data_dir=str(tmp_path))
    with pytest.raises(ModelLoadError, match="--memory-budget") as info:
        make_state(args)
    assert "weights" in str(info.value)


@pytest.fixture
def small_context_model(qwen3_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny qwen3 model with max_position_embeddings = CONTEXT (the original says 40960)."""
    folder = tmp_path / "qwen3-ctx64"
    folder.mkdir()
    for f in qwen3_model_dir.iterdir():
        if f.name != "config.json":
            (folder / f.name).symlink_to(f)
    config = json.loads((qwen3_model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] > CONTEXT
    config["max_position_embeddings"] = CONTEXT
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_prompt_longer_than_the_context_is_400(make_server, small_context_model: Path) -> None:
    live = make_server(model=str(small_context_model))
    long_chat = [{"role": "user", "content": "hi " * 100}]
    r = httpx.post(live.v1 + "/chat/completions", json={"messages": long_chat}, timeout=30)
    assert r.status_code == 400, r.text
    assert "context length" in r.json()["error"]["message"]
    assert str(CONTEXT) in r.json()["error"]["message"]
    for n in (CONTEXT + 1, CONTEXT):  # the prompt must leave room for one token
        r = httpx.post(live.v1 + "/completions", json={"prompt": [HI] * n}, timeout=30)
        assert r.status_code == 400, (n, r.text)
        assert str(CONTEXT) in r.json()["error"]["message"]
    # What fits is clamped to the context: 60 prompt tokens leave 4, whatever max_tokens says.
    body = {"prompt": [HI] * 60, "max_tokens": 10**12, "logit_bias": NO_EOS}
    r = httpx.post(live.v1 + "/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == CONTEXT - 60
    assert r.json()["choices"][0]["finish_reason"] == "length"
    shutil.rmtree(small_context_model)


ROUTES = [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2000}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2000}),
    ("/v1/messages", {"model": "m", "messages": MESSAGES, "max_tokens": 2000}),
    ("/v1/responses", {"input": "Tell me a story.", "max_output_tokens": 2000}),
]
ROUTE_IDS = ["chat", "completions", "messages", "responses"]


@pytest.mark.parametrize("path, body", ROUTES, ids=ROUTE_IDS)
def test_a_hung_up_stream_ends_its_row_quietly(qwen3_server, caplog, path: str, body) -> None:
    body = {**body, "logit_bias": NO_EOS, "stream": True}
    with caplog.at_level("ERROR"):
        with httpx.stream("POST", qwen3_server.url + path, json=body, timeout=60) as r:
            assert r.status_code == 200
            frames = (x for x in r.iter_lines() if x.startswith("data: "))
            for _ in range(4):
                next(frames)
            assert stats(qwen3_server)["active"] == 1
        wait_for(lambda: stats(qwen3_server)["active"] == 0, 5, "the row outlived its client")
        time.sleep(0.3)  # the stream's generator closes after the cancel
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert errors == [], [r.getMessage() for r in errors]


@pytest.mark.parametrize("path, body", ROUTES, ids=ROUTE_IDS)
def test_a_hung_up_request_ends_quietly(qwen3_server, caplog, path: str, body: dict) -> None:
    """A non-streaming request whose client hangs up, on every route: its row is cancelled
    and nothing is logged as an unhandled error (Messages' and Responses' 499 was once
    wrapped in JSON)."""
    body = {**body, "temperature": 0}
    outcome: list[str] = []
    impatient = threading.Thread(target=_hang_up, args=(qwen3_server.url + path, body, outcome))
    with caplog.at_level("ERROR"):
        impatient.start()
        wait_for(lambda: stats(qwen3_server)["active"] == 1, 5, "the request never started")
        impatient.join()
        assert outcome == ["hung up"], outcome
        wait_for(lambda: stats(qwen3_server)["active"] == 0, 5, "the row outlived its client")
        time.sleep(0.5)  # the handler returns after the cancel
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert errors == [], [r.getMessage() for r in errors]


def _hang_up(url: str, body: dict, outcome: list[str]) -> None:
    """The client gives up after 1.5 s (a 2000-token reply takes longer)."""
    try:
        r = httpx.post(url, json={**body, "logit_bias": NO_EOS}, timeout=1.5)
        outcome.append(f"answered {r.status_code}")
    except httpx.TimeoutException:
        outcome.append("hung up")


def test_memory_budget_is_mlx_memory_limit_until_close(qwen3_model_dir: Path, tmp_path) -> None:
    """Past --memory-budget MLX's allocator frees cached buffers instead of growing its cache
    (CUDA never clears it by default); closing gives the process its old limit back."""
    import mlx.core as mx

    before = mx.get_memory_limit()
    assert before != 2_000_000_000
    args = server_args(
        model=str(qwen3_model_dir), memory_budget="2000000000", data_dir=str(tmp_path)
    )
    state = make_state(args)
    try:
        assert mx.get_memory_limit() == 2_000_000_000
    finally:
        state.provider.close()
    assert mx.get_memory_limit() == before
    state.provider.close()  # idempotent: the old limit stays
    assert mx.get_memory_limit() == before


def test_no_memory_budget_leaves_mlx_memory_limit(qwen3_model_dir: Path, tmp_path) -> None:
    import mlx.core as mx

    before = mx.get_memory_limit()
    state = make_state(server_args(model=str(qwen3_model_dir), data_dir=str(tmp_path)))
    try:
        assert mx.get_memory_limit() == before
    finally:
        state.provider.close()
