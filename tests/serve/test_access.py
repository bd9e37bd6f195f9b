"""Who may talk to the server: loopback by default, the API key on everything but /health (in
each API's error shape), and CORS for the allowed origins only."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve.conftest import LiveServer, server_args, start_server

KEY = "k"
ORIGIN = "http://a.example"
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
}


@pytest.fixture(scope="module")
def guarded(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """A server with an API key and one allowed CORS origin."""
    live = start_server(
        model=str(qwen3_model_dir),
        data_dir=str(tmp_path_factory.mktemp("data")),
        api_key=KEY,
        allowed_origins=[ORIGIN],
    )
    yield live
    live.stop()


def call(live: LiveServer, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body = BODIES.get(path)
    return httpx.request(method, live.url + path, json=body, headers=headers, timeout=30)


def test_default_bind_is_loopback() -> None:
    assert server_args().host == "127.0.0.1"
    assert server_args().api_key is None


def test_health_needs_no_key(guarded: LiveServer) -> None:
    r = httpx.get(guarded.url + "/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"


GUARDED = [
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/metrics"),
]
WRONG = [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": KEY}]


@pytest.mark.parametrize("method, path", GUARDED)
@pytest.mark.parametrize("headers", WRONG, ids=["none", "bad-bearer", "bad-x-api-key", "no-scheme"])
def test_401_without_the_key(guarded: LiveServer, method: str, path: str, headers: dict) -> None:
    r = call(guarded, method, path, headers)
    assert r.status_code == 401, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "authentication_error" and "API key" in err["message"]


@pytest.mark.parametrize("method, path", GUARDED)
@pytest.mark.parametrize(
    "headers", [{"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}], ids=["bearer", "x-api-key"]
)
def test_200_with_the_key(guarded: LiveServer, method: str, path: str, headers: dict) -> None:
    r = call(guarded, method, path, headers)
    assert r.status_code == 200, r.text


def test_unknown_route_is_401_before_404(guarded: LiveServer) -> None:
    """Without the key nothing, not even which routes exist, is revealed."""
    assert httpx.get(guarded.url + "/v1/nope", timeout=30).status_code == 401
    r = httpx.get(guarded.url + "/v1/nope", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 404


def test_anthropic_path_gets_anthropic_shaped_401(guarded: LiveServer) -> None:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(guarded.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 401, r.text
    payload = r.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "authentication_error"
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]


def preflight(live: LiveServer, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    return httpx.options(live.v1 + "/chat/completions", headers=headers, timeout=30)


def test_cors_preflight_from_the_allowed_origin(guarded: LiveServer) -> None:
    """Browsers send preflights without credentials: they pass the key check."""
    r = preflight(guarded, ORIGIN)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]


def test_cors_preflight_from_another_origin(guarded: LiveServer) -> None:
    r = preflight(guarded, "http://b.example")
    assert "access-control-allow-origin" not in r.headers
    assert r.status_code >= 400


def test_cors_header_on_an_actual_response(guarded: LiveServer) -> None:
    auth = {"x-api-key": KEY}
    r = httpx.get(guarded.v1 + "/models", headers={**auth, "Origin": ORIGIN}, timeout=30)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.get(
        guarded.v1 + "/models", headers={**auth, "Origin": "http://b.example"}, timeout=30
    )
    assert "access-control-allow-origin" not in r.headers


def test_open_server_allows_any_origin(qwen3_server: LiveServer) -> None:
    """The default (`--allowed-origins *`), as mlx_lm.server."""
    r = preflight(qwen3_server, "http://anywhere.example")
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] in ("*", "http://anywhere.example")
    r = httpx.get(qwen3_server.v1 + "/models", timeout=30)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "host, key, warns",
    [
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("192.168.1.20", None, True),
        ("my-mac.local", None, True),
        ("0.0.0.0", "secret", False),
    ],
)
def test_listening_beyond_this_machine_without_a_key_warns(host, key, warns) -> None:
    from mlxd.serve.main import exposure_warning

    warning = exposure_warning(host, key)
    assert (warning is not None) == warns
    if warns:
        assert host in warning and "--api-key" in warning
