"""Every route's requests, valid ones first (a minimal body and a rich one that reaches every
nested place: content parts and blocks, tool calls and results, tools, response formats, input
items), then the hostile requests built from them: one to three fields anywhere in the body
replaced by, added as or deleted for hostile values, and hostile path parameters."""

import copy
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from . import hostile

_ARGS = json.dumps({"city": "Paris"})
_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
USER = {"role": "user", "content": "hi"}

CHAT_RICH: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": _ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [{"type": "function", "function": {"name": "w", "description": "weather",
                                                "parameters": _PARAMS}}],
    "tool_choice": "auto", "max_tokens": 2, "max_completion_tokens": 2, "temperature": 0.5,
    "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 7, "stop": ["zz"], "logprobs": True,
    "top_logprobs": 2, "logit_bias": {"11": 1.5}, "repetition_penalty": 1.1,
    "presence_penalty": 0.1, "frequency_penalty": 0.1, "n": 1,
    "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False},
    "model": "default_model", "adapters": None,
}  # fmt: skip
CHAT_FORMAT: dict[str, Any] = {
    "messages": [USER], "max_tokens": 2,
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _SCHEMA}},
}  # fmt: skip
COMPLETION_RICH: dict[str, Any] = {
    "prompt": [9707, 11, 1879], "max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": 3,
    "stop": "zz", "logprobs": True, "top_logprobs": 1, "logit_bias": {"11": -1}, "n": 2,
    "xtc_probability": 0.1, "xtc_threshold": 0.2, "repetition_context_size": 8,
    "model": "default_model",
}  # fmt: skip
_BLOCKS_ASSISTANT = [
    {"type": "thinking", "thinking": "hmm", "signature": "s"},
    {"type": "redacted_thinking", "data": "x"},
    {"type": "text", "text": "checking"},
    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
]
MESSAGES_RICH: dict[str, Any] = {
    "model": "claude-x", "max_tokens": 2, "system": [{"type": "text", "text": "be brief"}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": _BLOCKS_ASSISTANT},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "sunny"}],
                                      "is_error": False}]},
        {"role": "assistant", "content": "It is"},  # a prefill: the reply continues it
    ],
    "tools": [{"name": "w", "description": "weather", "input_schema": _PARAMS}],
    "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"}, "temperature": 0.5,
    "top_p": 0.9, "top_k": 5, "stop_sequences": ["zz", "."], "metadata": {"user_id": "u"},
}  # fmt: skip
RESPONSES_RICH: dict[str, Any] = {
    "input": [
        {"type": "message", "role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": _ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "sunny"}]},
        {"role": "user", "content": "thanks"},
    ],
    "instructions": "answer", "max_output_tokens": 2, "temperature": 0.5, "top_p": 0.9,
    "tools": [{"type": "function", "name": "w", "description": "weather", "parameters": _PARAMS}],
    "tool_choice": "auto", "store": False, "metadata": {"k": "v"}, "parallel_tool_calls": True,
    "chat_template_kwargs": {"enable_thinking": False}, "top_k": 5, "seed": 1,
    "model": "default_model",
}  # fmt: skip
RESPONSES_FORMAT: dict[str, Any] = {
    "input": "hi", "max_output_tokens": 2,
    "text": {"format": {"type": "json_schema", "name": "x", "schema": _SCHEMA}},
}  # fmt: skip

# Fields a handler reads or refuses that the rich bodies leave out: added by the mutations too.
EXTRA_FIELDS = (
    "model", "adapters", "draft_model", "num_draft_tokens", "response_format",
    "structured_outputs", "previous_response_id", "background", "conversation", "prompt",
    "reasoning", "user", "output_config", "stream", "stream_options", "n", "role_mapping",
    "logprobs", "top_logprobs", "max_tokens", "messages", "input", "tools", "tool_choice",
    "speculative", "prediction",
)  # fmt: skip


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # with {name} for a path parameter
    api: str  # "openai" or "anthropic": the shape of its errors
    templates: tuple[dict[str, Any], ...] = ()  # valid bodies (POST)
    streams: bool = False

    @property
    def name(self) -> str:
        return f"{self.method} {self.path}"


CHAT_PREDICTION: dict[str, Any] = {
    "messages": [USER], "max_tokens": 2, "speculative": "ngram",
    "prediction": {"type": "content", "content": [{"type": "text", "text": "hello"}]},
}  # fmt: skip
_CHAT = (
    {"messages": [USER], "max_tokens": 2},
    CHAT_RICH,
    CHAT_FORMAT,
    CHAT_PREDICTION,
)
ROUTES = (
    Route("POST", "/v1/chat/completions", "openai", _CHAT, streams=True),
    Route("POST", "/chat/completions", "openai", _CHAT[:1], streams=True),
    Route("POST", "/v1/completions", "openai", ({"prompt": "hi", "max_tokens": 2},
                                                COMPLETION_RICH), streams=True),
    Route("POST", "/v1/messages", "anthropic", (
        {"model": "m", "max_tokens": 2, "messages": [USER]}, MESSAGES_RICH), streams=True),
    Route("POST", "/v1/messages/count_tokens", "anthropic", (
        {"model": "m", "messages": [USER]},
        {k: v for k, v in MESSAGES_RICH.items() if k in ("model", "messages", "system", "tools",
                                                         "tool_choice", "thinking")})),
    Route("POST", "/v1/responses", "openai", (
        {"input": "hi", "max_output_tokens": 2}, RESPONSES_RICH, RESPONSES_FORMAT), streams=True),
    Route("GET", "/v1/responses/{response_id}", "openai"),
    Route("DELETE", "/v1/responses/{response_id}", "openai"),
    Route("GET", "/v1/models/{model_id}", "openai"),
    Route("GET", "/v1/models", "openai"),
    Route("GET", "/health", "openai"),
)  # fmt: skip
POST_ROUTES = tuple(r for r in ROUTES if r.method == "POST")
# Generation stays short: a valid but large budget is cut to this (a value past 64 bits stays).
MOST_TOKENS = 4
_BUDGETS = {"max_tokens": MOST_TOKENS, "max_completion_tokens": MOST_TOKENS,
            "max_output_tokens": MOST_TOKENS, "n": 2}  # fmt: skip


def cap_work(body: Any) -> Any:
    """Cut a valid but costly budget (max_tokens 10**6, n 100) to a small one."""
    if isinstance(body, dict):
        for key, most in _BUDGETS.items():
            v = body.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and most < v < 2**63:
                body[key] = most
    return body


def _places(value: Any, at: tuple = ()) -> list[tuple]:
    """The path of every node of a JSON document, the root included."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _places(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _places(v, (*at, i))
    return out


def _get(doc: Any, at: tuple) -> Any:
    for step in at:
        doc = doc[step]
    return doc


@st.composite
def mutated(draw: st.DrawFn, template: dict[str, Any]) -> Any:
    """`template` with one to three hostile edits anywhere in it."""
    doc: Any = copy.deepcopy(template)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(_places(doc)))
        node = _get(doc, at)
        action = draw(st.sampled_from(["replace", "replace", "add", "delete"]))
        if action == "add" and isinstance(node, dict):
            key = draw(st.one_of(st.sampled_from(EXTRA_FIELDS), hostile.keys()))
            node[key] = draw(hostile.values())
        elif action == "add" and isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(hostile.values()))
        elif action == "delete" and at:
            del _get(doc, at[:-1])[at[-1]]
        elif at:
            typed = draw(st.booleans())  # half of the values keep the field's type
            value = draw(hostile.like(node) if typed else hostile.values())
            _get(doc, at[:-1])[at[-1]] = value
        else:
            doc = draw(hostile.values())  # the whole body: not even an object
    return doc


@st.composite
def post_body(draw: st.DrawFn, route: Route) -> Any:
    template = dict(draw(st.sampled_from(route.templates)))
    if route.streams:
        template["stream"] = draw(st.booleans())
    return cap_work(draw(mutated(template)))


def _encoded(text: str) -> str:
    """Percent-encoded, a lone surrogate as its WTF-8 bytes (no valid UTF-8 holds it)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def path_param() -> st.SearchStrategy[str]:
    return hostile.strings().map(lambda s: _encoded(s[:1500]))  # a URL stays under 64 KiB


def query() -> st.SearchStrategy[str]:
    """A hostile query string (handlers read none; the router and middleware still parse it)."""
    pair = st.tuples(hostile.keys(), hostile.strings()).map(
        lambda kv: "=".join(_encoded(x[:1000]) for x in kv)
    )
    return st.lists(pair, max_size=3).map(lambda pairs: "?" + "&".join(pairs) if pairs else "")


@st.composite
def request(draw: st.DrawFn, route: Route) -> tuple[str, str, Any]:
    """(method, path, JSON body or None) of one hostile request to `route`."""
    path = route.path
    if "{" in path:
        name = path[path.index("{") : path.index("}") + 1]
        path = path.replace(name, draw(path_param()))
    if route.method == "POST":
        return route.method, path, draw(post_body(route))
    return route.method, path + draw(query()), None


def route_of(path: str, method: str) -> Route:
    for route in ROUTES:
        if route.method == method and route.path == path:
            return route
    raise KeyError(f"{method} {path}: no route in bodies.ROUTES")
