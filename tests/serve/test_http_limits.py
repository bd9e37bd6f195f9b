"""A hostile client's connections against the real uvicorn server of `mlxd serve`
(main.http_server): a request head or body that stalls is answered 408 and its connection
closed, past --max-connections the longest-waiting connection makes room (so half-open ones
never starve /health) and busy ones get a quick 503, under both HTTP parsers."""

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve.conftest import free_port, server_args

from mlxd.serve.app import build_app
from mlxd.serve.http_limits import connection_cap
from mlxd.serve.main import http_server, make_state

MESSAGES = [{"role": "user", "content": "Tell me a story."}]
NO_EOS = {"151643": -100, "151645": -100}  # Qwen3's end tokens: rows run to max_tokens


class Live:
    def __init__(self, model: Path, tmp: Path, **flags: Any) -> None:
        self.port = free_port()
        config = server_args(model=str(model), data_dir=str(tmp), port=self.port, **flags)
        self.state = make_state(config)
        self.server = http_server(build_app(self.state), config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def open(self, data: bytes = b"") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if data:
            s.sendall(data)
        return s

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.state.provider.close()


@pytest.fixture
def serve(qwen3_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Live]]:
    started: list[Live] = []

    def make(**flags: Any) -> Live:
        started.append(Live(qwen3_model_dir, tmp_path / "data", **flags))
        return started[-1]

    yield make
    for live in started:
        live.stop()


def read_all(s: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes the connection (fails if it stays open)."""
    s.settimeout(seconds)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_stalled_head_or_body_is_408_and_closed(serve, caplog, http: str) -> None:
    live = serve(http=http, header_timeout=0.5, body_timeout=0.5)
    caplog.set_level("ERROR")
    t0 = time.monotonic()
    silent, half, drip = live.open(), live.open(HALF_HEAD), live.open(b"G")
    drip.sendall(b"ET /hea")  # progress on the head does not reset its deadline
    body = b'{"messages": [{"role": "user", "content": "hi"}]'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n"
    stalled_body = live.open(head + body)
    kept = live.open(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"}"):
        answer += kept.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 ")
    kept.sendall(b"GET /health HTT")  # a keep-alive connection's next head stalls too
    replies = [read_all(s, 5) for s in (silent, half, drip, kept)]
    assert time.monotonic() - t0 < 2.5  # closed at the deadline, not by the client
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 408 "), reply
    reply = read_all(stalled_body, 5)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert b"stalled" in reply
    # A whole request in time is answered as ever, and the engine took no stalled one.
    assert httpx.get(live.url + "/health", timeout=5).status_code == 200
    stats = live.state.provider.default.engine.stats()
    assert stats["active"] == 0 and stats["waiting"] == 0
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_a_client_gone_mid_body_ends_quietly(serve, caplog) -> None:
    live = serve()
    caplog.set_level("ERROR")
    head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n"
    for _ in range(3):
        live.open(head + b'{"model": "m", "messages": [').close()
    time.sleep(0.5)  # the server reads the hang-ups
    assert httpx.get(live.url + "/health", timeout=5).status_code == 200
    # Starlette's ClientDisconnect reached the app's catch-all, which logged it as a crash.
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_half_open_connections_never_starve_health(serve) -> None:
    live = serve(header_timeout=30, max_connections=20)
    stalled = [live.open(HALF_HEAD) for _ in range(60)]  # 3x the limit, none ever finishes
    for _ in range(5):
        r = httpx.get(live.url + "/health", timeout=5)
        assert r.status_code == 200, r.text
    # The oldest half-open connections were closed to make room (without waiting 30 s).
    assert read_all(stalled[0], 5) == b""
    limits = live.server.limits
    assert limits.evicted >= 40 and limits.refused == 0
    for s in stalled:
        s.close()


def test_past_the_limit_of_busy_connections_a_new_one_is_503(serve) -> None:
    live = serve(max_connections=2, batch=1)
    url = live.url + "/v1/chat/completions"
    body = {"messages": MESSAGES, "max_tokens": 2000, "logit_bias": NO_EOS, "stream": True}
    with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b:
        with a.stream("POST", url, json=body) as ra, b.stream("POST", url, json=body) as rb:
            assert ra.status_code == rb.status_code == 200
            t0 = time.monotonic()
            third = live.open()  # both connections are busy: nothing to close for it
            reply = read_all(third, 5)
            assert time.monotonic() - t0 < 1
            assert reply.startswith(b"HTTP/1.1 503 "), reply
            assert b"max-connections" in reply
    assert live.server.limits.refused == 1
    # Once they are done (their connections closed: the server may see that a moment later)
    # there is room again.
    deadline = time.time() + 5
    while (status := _health(live)) != 200 and time.time() < deadline:
        time.sleep(0.05)
    assert status == 200


def _health(live: Live) -> int | None:
    try:
        return httpx.get(live.url + "/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def test_the_connection_cap_keeps_file_descriptors_in_reserve() -> None:
    assert connection_cap(512, None) == 512  # no limit known
    assert connection_cap(512, 20000) == 512
    assert connection_cap(512, 1024) == 512  # 1024 - 256 left room for 768
    assert connection_cap(512, 256) == 128  # macOS's default: half for connections
    assert connection_cap(512, 600) == 450  # a quarter held back
    assert connection_cap(512, 100) == 8  # never none
    assert connection_cap(2, 100) == 2  # a lower --max-connections stands
