"""A chat or completions body validated into one typed request, before any model is looked up
or any prompt is built: every field's type and bounds, the messages' shapes, the tools and
`tool_choice`, the model's name. What it refuses is a 400 naming the field."""

from dataclasses import dataclass
from typing import Any

from ..config import ServeConfig
from .errors import bad_request
from .media import MediaPolicy, MediaReader
from .params import (
    MAX_TOP,
    GenParams,
    ModelRef,
    check,
    model_ref,
    read_params,
    refuse_unsupported,
    tool_choice_tools,
)
from .prompt import normalize_messages
from .speculation import prediction, refuse_with_prediction
from .text import forced_tool


@dataclass
class OpenAIRequest:
    chat: bool
    model: ModelRef
    stream: bool
    include_usage: bool
    params: GenParams
    tools: list[dict] | None = None
    # chat: text contents (content lists where images are: media_parts.py), arguments as dicts
    messages: list[dict[str, Any]] | None = None
    prompts: list[str | list[int]] | None = None  # completions: one choice (or n) each
    legacy_logprobs: int | None = None  # completions' integer `logprobs`: OpenAI's old shape
    template_args: dict[str, Any] | None = None
    role_mapping: dict[str, Any] | None = None


def parse_openai(body: dict[str, Any], config: ServeConfig, chat: bool) -> OpenAIRequest:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be of type bool", "stream")
    opts = body.get("stream_options")
    legacy = None if chat else legacy_logprobs(body)
    if legacy is not None:  # read as top_logprobs; mlx_lm.server's boolean stays as it was
        body = {**body, "logprobs": True, "top_logprobs": legacy}
    params = read_params(body, config)
    refuse_unsupported(body)
    req = OpenAIRequest(
        chat=chat,
        model=model_ref(body),
        stream=stream,
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage")),
        params=params,
        legacy_logprobs=legacy,
    )
    if chat:
        _chat_fields(req, body, config)
    else:
        if body.get("prediction") is not None:  # OpenAI's completions have no such field
            raise bad_request("prediction is a chat completions field", "prediction")
        req.prompts = prompts(body)
        if len(req.prompts) * params.n > MAX_PROMPTS:  # rows one request may queue
            raise bad_request(f"prompt: at most {MAX_PROMPTS} choices (prompts × n)", "prompt")
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
    req.messages = normalize_messages(body["messages"], MediaReader(MediaPolicy.of(config)))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    req.template_args = {**config.chat_template_args, **kwargs}
    mapping = body.get("role_mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise bad_request("role_mapping must be an object", "role_mapping")
    req.role_mapping = mapping
    req.params.prediction = prediction(body)
    if req.params.prediction is not None:
        refuse_with_prediction(body, req.params, req.tools)


MAX_PROMPTS = 128  # choices one completions request may ask for (prompts × n; `n` alone: 128)


def legacy_logprobs(body: dict[str, Any]) -> int | None:
    """OpenAI completions' `logprobs`: an integer, the alternatives to list per token (0: the
    sampled token's only). A boolean is mlx_lm.server's field and reads as before."""
    value = body.get("logprobs")
    if type(value) is not int:
        return None
    if body.get("top_logprobs") is not None:
        raise bad_request("give logprobs as an integer or top_logprobs, not both", "logprobs")
    return check("logprobs", value, int, lo=0, hi=MAX_TOP)


def _tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """OpenAI's four shapes: a string, token ids, a list of strings, a list of token-id
    lists; each list entry is its own prompt (its own choices)."""
    if "prompt" not in body:
        raise bad_request("Request did not contain a prompt", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str) or _tokens(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and len(prompt) <= MAX_PROMPTS:
        if all(isinstance(p, str) for p in prompt) or all(_tokens(p) for p in prompt):
            return list(prompt)
    raise bad_request(
        "prompt must be a string, token ids, or a list of strings or of token-id lists "
        f"(at most {MAX_PROMPTS})",
        "prompt",
    )
