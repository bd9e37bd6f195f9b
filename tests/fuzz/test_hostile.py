"""Hostile values in every field of every route (bodies.py, hostile.py): the server never
answers 5xx, always answers in time, every 4xx is JSON in its API's error shape, no stream
hides a failure in an error frame, and a normal request is served afterwards.

CI runs a bounded, derandomized size; `HYPOTHESIS_PROFILE=deep` (tests/conftest.py) runs
~50x more cases, new ones each run:

    HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest -q -n 0 -p no:cacheprovider tests/fuzz
"""

import json
import sys
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from .bodies import POST_ROUTES, ROUTES, Route, request
from .checks import describe, problem

DEADLINE_S = 30.0
# Cases per route in CI (the rich POST routes get more): the whole file stays near a minute.
CI_EXAMPLES = {"POST": 100, "GET": 25, "DELETE": 15}
DEEP = settings.get_current_profile_name() != "default"


def send(client: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    """`body` as a hostile client writes it: lone surrogates as escapes, NaN as NaN."""
    content = None if body is None else json.dumps(body)
    headers = {"content-type": "application/json"} if body is not None else {}
    return client.request(method, path, content=content, headers=headers)


def check(client: httpx.Client, method: str, path: str, body: Any) -> None:
    try:
        r = send(client, method, path, body)
    except httpx.TimeoutException:
        raise AssertionError(describe(method, path, body, "no answer in time", "")) from None
    why = problem(path, r.status_code, r.headers.get("content-type", ""), r.text)
    assert why is None, f"{why}: {describe(method, path, body, r.status_code, r.text)}"


def fuzz(url: str, route: Route, examples: int) -> int:
    """Send `examples` hostile requests to `route`; returns how many went out."""
    sent = [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=not DEEP,  # CI: the same cases every run, so a failure reproduces
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(req=request(route))
    def run(req: tuple[str, str, Any]) -> None:
        sent[0] += 1
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as client:
            check(client, *req)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # hypothesis prints a 900-deep failing body
    try:
        run()
    finally:
        sys.setrecursionlimit(limit)
    return sent[0]


def serves(url: str) -> bool:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize("route", POST_ROUTES, ids=[r.path for r in POST_ROUTES])
def test_every_valid_template_is_served(fuzz_server, route: Route) -> None:
    """The mutations start from bodies the server takes whole, so each edit reaches its
    field instead of being refused for another one."""
    with httpx.Client(base_url=fuzz_server.url, timeout=DEADLINE_S) as client:
        for template in route.templates:
            for stream in (False, True) if route.streams else (None,):
                body = template if stream is None else {**template, "stream": stream}
                r = send(client, "POST", route.path, body)
                assert r.status_code == 200, describe("POST", route.path, body, r.status_code,
                                                      r.text)  # fmt: skip
                check(client, "POST", route.path, body)


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_hostile_requests(fuzz_server, route: Route) -> None:
    examples = settings.default.max_examples if DEEP else CI_EXAMPLES[route.method]
    assert fuzz(fuzz_server.url, route, examples) >= examples // 2
    assert serves(fuzz_server.url), "the server stopped serving after the fuzzing"


def test_the_fuzz_is_not_blind(fuzz_server, monkeypatch) -> None:
    """A handler that crashes on some field is found and reported with the body."""
    from mlxd.serve import params

    real = params.stop_words

    def brittle(value: Any, name: str = "stop") -> list[str]:
        if value is not None and not isinstance(value, list):
            raise RuntimeError("deliberately broken for the test")
        return real(value, name)

    monkeypatch.setattr(params, "stop_words", brittle)
    route = next(r for r in ROUTES if r.path == "/v1/completions")
    with pytest.raises(AssertionError, match="500.*/v1/completions"):
        fuzz(fuzz_server.url, route, 60)


def _nest(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


# Cases the fuzz and the hostile run found, each kept as a regression test.
FOUND = [
    # /v1/messages once turned an integral float into an int past the 64-bit check, so
    # max_tokens 1e19 (or 2.14e301) was an unbounded budget: no answer within the deadline.
    pytest.param("/v1/messages", {"model": "m", "max_tokens": 1e19, "messages": [
        {"role": "user", "content": "hi"}]}, id="messages-float-max-tokens"),
    # A list nested 900 deep in a message (any key) once passed the body's depth check, then
    # a recursive copy of the messages raised RecursionError: a 500.
    pytest.param("/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi", "x": _nest(900)}]}, id="chat-deep-message"),
    pytest.param("/v1/responses", {"max_output_tokens": 2, "input": [
        {"role": "user", "content": "hi", "x": _nest(900)}]}, id="responses-deep-item"),
]  # fmt: skip


@pytest.mark.parametrize("path, body", FOUND)
def test_cases_the_fuzz_found(fuzz_server, path: str, body: dict[str, Any]) -> None:
    with httpx.Client(base_url=fuzz_server.url, timeout=DEADLINE_S) as client:
        check(client, "POST", path, body)
