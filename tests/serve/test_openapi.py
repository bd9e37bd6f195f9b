"""The served /openapi.json describes what the server does: path parameters, every error
status in each API's shape, server-sent events on the streaming routes, the 200 shapes; a 405
names the allowed methods. Then schemathesis holds every route's answers to that document
(status codes, content types, response schemas)."""

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
STREAMING = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/v1/messages",
             "/v1/responses"]  # fmt: skip
OPERATIONS = [
    ("POST", p) for p in [*STREAMING, "/v1/messages/count_tokens"]
] + [("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("GET", "/health"),
     ("GET", "/v1/responses/{response_id}"), ("DELETE", "/v1/responses/{response_id}")]  # fmt: skip


@pytest.fixture(scope="module")
def document(qwen3_server) -> dict[str, Any]:
    return httpx.get(qwen3_server.url + "/openapi.json", timeout=30).json()


def test_path_parameters_are_declared(document) -> None:
    models, responses = "/v1/models/{model_id}", "/v1/responses/{response_id}"
    for path, name, methods in ((models, "model_id", ["get"]),
                                (responses, "response_id", ["get", "delete"])):  # fmt: skip
        for method in methods:
            params = document["paths"][path][method]["parameters"]
            assert [(p["name"], p["in"], p["required"]) for p in params] == [(name, "path", True)]


@pytest.mark.parametrize("method, path", OPERATIONS)
def test_every_error_is_documented_in_its_apis_shape(document, method, path) -> None:
    responses = document["paths"][path][method.lower()]["responses"]
    for status in ("400", "401", "404", "405", "413", "429", "500"):
        schema = responses[status]["content"]["application/json"]["schema"]
        wanted = {"type", "error"} if path.startswith("/v1/messages") else {"error"}
        assert set(schema["required"]) == wanted, (status, schema)
    content = responses["200"]["content"]
    assert ("text/event-stream" in content) == (method == "POST" and path in STREAMING)


@pytest.mark.parametrize(
    "path, shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")]
)
def test_a_wrong_method_is_405_with_allow(qwen3_server, path, shape) -> None:
    r = httpx.put(qwen3_server.url + path, timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
    body = r.json()
    assert ("error" in body and body.get("type") == "error") == (shape == "anthropic"), body


# Where a length is optional (/v1/messages requires max_tokens: a case without one is negative).
OPTIONAL_LENGTH = {
    "/v1/chat/completions": "max_tokens",
    "/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}


def _shrink(case: Any) -> None:
    """Short generations, and no model name that means loading one."""
    body = case.body
    if not isinstance(body, dict):
        return
    keys = ("max_tokens", "max_completion_tokens", "max_output_tokens")
    for key in keys:
        v = body.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 4:
            body[key] = 4
    if case.path in OPTIONAL_LENGTH and not any(key in body for key in keys):
        body[OPTIONAL_LENGTH[case.path]] = 4  # not the default 512: the same answer's shape
    if "/v1/messages" in case.path:
        body["model"] = "m" if "model" in body else body.get("model")
    else:
        body.pop("model", None)
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2


# /chat/completions is /v1/chat/completions' handler and schemas (serve/app.py): held once.
CONFORMANCE = [op for op in OPERATIONS if op != ("POST", "/chat/completions")]


@pytest.mark.parametrize("method, path", CONFORMANCE)
def test_answers_conform_to_the_document(qwen3_server, method, path) -> None:
    schema = schemathesis.openapi.from_url(qwen3_server.url + "/openapi.json")
    operation = schema[path][method]
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if method == "POST" else [])

    for mode in modes:

        @settings(max_examples=5, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            _shrink(case)
            response = case.call(base_url=qwen3_server.url, timeout=30)
            assert response.status_code < 500, response.text[:300]
            case.validate_response(response, checks=CHECKS)

        run()
