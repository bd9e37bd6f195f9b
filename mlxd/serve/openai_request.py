"""A chat or completions body validated into one typed request, before any model is looked up
or any prompt is built: every field's type and bounds, the messages' shapes, the tools and
`tool_choice`, the model's name. What it refuses is a 400 naming the field."""

from dataclasses import dataclass
from typing import Any

from ..config import ServeConfig
from .errors import bad_request
from .params import (
    GenParams,
    ModelRef,
    model_ref,
    read_params,
    refuse_unsupported,
    tool_choice_tools,
)
from .prompt import normalize_messages
from .text import forced_tool


@dataclass
class OpenAIRequest:
    chat: bool
    model: ModelRef
    stream: bool
    include_usage: bool
    params: GenParams
    tools: list[dict] | None = None
    messages: list[dict[str, Any]] | None = None  # chat: text contents, arguments as dicts
    prompt: str | list[int] | None = None  # completions
    template_args: dict[str, Any] | None = None
    role_mapping: dict[str, Any] | None = None


def parse_openai(body: dict[str, Any], config: ServeConfig, chat: bool) -> OpenAIRequest:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be of type bool", "stream")
    opts = body.get("stream_options")
    params = read_params(body, config)
    refuse_unsupported(body)
    req = OpenAIRequest(
        chat=chat,
        model=model_ref(body),
        stream=stream,
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage")),
        params=params,
    )
    if chat:
        _chat_fields(req, body, config)
    else:
        req.prompt = _prompt(body)
    return req


def _chat_fields(req: OpenAIRequest, body: dict[str, Any], config: ServeConfig) -> None:
    req.tools = tool_choice_tools(body)
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):  # "required" or a named function: constrained
        if req.params.constraint is not None:
            raise bad_request("tool_choice cannot force a call together with a response format",
                              "tool_choice")  # fmt: skip
        req.params.constraint, req.params.forced_tool = forced_tool(req.tools, choice)
    if "messages" not in body:
        raise bad_request("Request did not contain messages", "messages")
    req.messages = normalize_messages(body["messages"])
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    req.template_args = {**config.chat_template_args, **kwargs}
    mapping = body.get("role_mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise bad_request("role_mapping must be an object", "role_mapping")
    req.role_mapping = mapping


def _prompt(body: dict[str, Any]) -> str | list[int]:
    """A string, token ids, or a list holding one string (mlx_lm.server's three shapes)."""
    if "prompt" not in body:
        raise bad_request("Request did not contain a prompt", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise bad_request("prompt must be a string or a list of token ids", "prompt")
