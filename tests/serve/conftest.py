"""A live mlxd server on loopback for the HTTP tests: uvicorn in a thread of the test process,
on a tiny random qwen3 model with the real Qwen3 tokenizer (chat template, think and tool
markers), or on the embedded default model (SmolLM2) for real text."""

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest


def server_args(**overrides: Any) -> Any:
    """`mlxd serve`'s config with no flags, then `overrides` (ServeConfig fields)."""
    from mlxd.cli.serve import parse_config

    return replace(parse_config([]), **overrides)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: Any, timeout: float = 120) -> bool:
    """Poll `url`/health until it answers 200; False if `proc` (a Popen) exits or time runs out."""
    import httpx

    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    state: Any  # mlxd.serve.app.ServerState
    server: Any
    thread: threading.Thread

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.state.close()


def start_server(**overrides: Any) -> LiveServer:
    from mlxd.serve.app import build_app
    from mlxd.serve.main import http_server, make_state

    port = free_port()
    args = server_args(port=port, **overrides)
    state = make_state(args)
    # the server `mlxd serve` runs, its deadlines and connection cap included
    server = http_server(build_app(state), replace(args, host="127.0.0.1", log_level="WARNING"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return LiveServer(f"http://127.0.0.1:{port}", state, server, thread)


@pytest.fixture(scope="session")
def qwen3_model_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("qwen3")


@pytest.fixture(scope="module")
def qwen3_server(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """A server on the tiny random qwen3 model (text is random; shapes are what is tested)."""
    live = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path_factory.mktemp("data")))
    yield live
    live.stop()


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server on the embedded SmolLM2 (real English text), shared by the whole session."""
    live = start_server(model=None, data_dir=str(tmp_path_factory.mktemp("smol-data")))
    yield live
    live.stop()


@pytest.fixture
def make_server(qwen3_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """`make_server(**flags)`: a fresh server with options (stopped after the test)."""
    started: list[LiveServer] = []

    def make(**overrides: Any) -> LiveServer:
        overrides.setdefault("model", str(qwen3_model_dir))
        overrides.setdefault("data_dir", str(tmp_path / "data"))
        live = start_server(**overrides)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


@pytest.fixture
def rows_fail_mid_stream(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Every row the servers build from now on raises "boom in the row" at its 3rd generated
    token (after the status line and a first chunk went out); call the result to undo."""
    from mlxd.serve import generation

    real = generation.build_request

    def build(served, prompt, params, *rest):
        req = real(served, prompt, params, *rest)
        start = len(prompt.tokens)

        def fail(tokens, logits):
            if tokens.shape[-1] - start >= 3:
                raise RuntimeError("boom in the row")
            return logits

        req.logits_processors = [fail]
        return req

    monkeypatch.setattr(generation, "build_request", build)
    return monkeypatch.undo
