"""Schema-driven fuzzing (schemathesis, from the live server's /openapi.json) of the chat and
completions endpoints, with bodies that fit the schema and bodies that do not: never a 5xx,
every answer in time, and every 4xx a JSON error in OpenAI's shape."""

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation.modes import GenerationMode

TIMEOUT_S = 30.0
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 10}  # x 2 endpoints: 60
# JSON Schema's "integer" admits 1.0, which mlx-lm (and so mlxd) refuses: test_bad_input covers
# that, so positive cases send such values as ints and more of them reach the model.
INT_FIELDS = ("max_tokens", "max_completion_tokens", "top_k", "top_logprobs", "seed", "n")
ENDPOINTS = ["/v1/chat/completions", "/v1/completions"]
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


def _cap(body: dict[str, Any], key: str, most: int) -> None:
    """Keep generation short; values the server must refuse (wrong type, < 1) stay."""
    v = body.get(key)
    if isinstance(v, int) and not isinstance(v, bool) and v > most:
        body[key] = most


def shrink_work(case: Any, mode: GenerationMode) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for key in INT_FIELDS if mode.is_positive else ():
        if isinstance(body.get(key), float) and body[key].is_integer():
            body[key] = int(body[key])
    for key in ("max_tokens", "max_completion_tokens"):
        _cap(body, key, 4)
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = 4
    _cap(body, "n", 2)
    if isinstance(body.get("model"), str):
        del body["model"]  # any other name means loading a model from disk or the network


def content_type(r: Any) -> str:
    """schemathesis' Response keeps headers as {name: [values]}."""
    return next((",".join(v) for k, v in r.headers.items() if k.lower() == "content-type"), "")


def check_response(r: Any) -> None:
    where = f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text[:300]}"
    assert r.status_code < 500, f"5xx: {where}"
    assert r.elapsed < TIMEOUT_S, where
    if r.status_code >= 400:
        assert content_type(r).startswith("application/json"), where
        err = r.json().get("error")
        assert isinstance(err, dict), where
        assert {"message", "type", "param", "code"} <= set(err), where
        assert isinstance(err["message"], str) and err["message"], where
    elif content_type(r).startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), where
    else:
        assert r.status_code == 200 and r.json()["choices"], where


def fuzz(base_url: str, path: str, mode: GenerationMode, examples: int, shrink: bool) -> int:
    """Run `examples` cases against `path`; returns how many were sent."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operation = schema[path]["POST"]
    sent = [0]
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a failure in CI reproduces locally
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        shrink_work(case, mode)
        sent[0] += 1
        response = case.call(base_url=base_url, timeout=TIMEOUT_S)
        check_response(response)

    run()
    return sent[0]


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("path", ENDPOINTS)
def test_fuzz_endpoint(qwen3_server, path: str, mode: GenerationMode) -> None:
    assert fuzz(qwen3_server.url, path, mode, EXAMPLES[mode], shrink=True) >= EXAMPLES[mode] // 2
    r = httpx.post(
        qwen3_server.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30
    )
    assert r.status_code == 200, "the server stopped serving after the fuzzing"


def test_a_server_error_fails_the_fuzz(qwen3_server, monkeypatch) -> None:
    """The harness is not blind: a handler that crashes is reported."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("deliberately broken for the test")

    monkeypatch.setattr(qwen3_server.state.provider, "get", broken)
    with pytest.raises(AssertionError, match="5xx"):
        fuzz(qwen3_server.url, "/v1/chat/completions", GenerationMode.POSITIVE, 5, shrink=False)
