"""Anthropic Messages requests in the shapes the chat template knows (OpenAI-style messages
and function tools), and the Anthropic fields in the shape of every endpoint's GenParams.

- `system` (a string or text blocks) becomes the first message, role `system`.
- Text blocks of one turn are joined with a newline.
- Assistant `tool_use` blocks become `tool_calls` ({id, type: function, function: {name,
  arguments}}) with `arguments` a dict, as templates expect after mlx_lm.server's parsing.
- User `tool_result` blocks become `tool` messages ({tool_call_id, content}) in their place.
- Assistant `thinking` blocks become `reasoning_content` (Qwen3-style templates render it;
  others ignore it); `redacted_thinking` blocks are dropped.
- `thinking: {type: enabled | adaptive | disabled}` becomes the template argument
  `enable_thinking` (true / true / false).
- A conversation ending with an assistant turn is a prefill: the reply continues that text.
- `tool_choice` `any` / `tool` and `output_config.format` are enforced as the row's grammar
  (`constrain`). User turns' `image` blocks are images (anthropic_messages.py); a model that
  takes none refuses them. What cannot be honoured is refused with a 400 naming it, never
  silently dropped: documents, images inside tool results, server tools. Fields that change
  nothing here are accepted and ignored:
  `metadata`, `output_config.effort`, `thinking.budget_tokens`, `cache_control`, a tool's
  `strict`, `service_tier` and the like.
"""

from dataclasses import dataclass, field
from typing import Any

from .anthropic_messages import convert_messages
from .errors import INT64, bad_request
from .media import DEFAULT_POLICY, MediaPolicy, MediaReader
from .params import NUM, GenParams, check
from .prompt import Prompt, chat_prompt
from .speculation import speculative


@dataclass
class Conversation:
    """What the chat template gets for one Messages request."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    template_args: dict[str, Any] = field(default_factory=dict)
    prefill: bool = False  # the last message is the assistant's: continue it


def convert_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic client tools {name, description, input_schema} -> OpenAI function tools."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools.{j}: a tool must be an object", "tools")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise bad_request(
                f"tools.{j}: server tools (type '{kind}') are not supported; define the tool "
                "with name, description and input_schema",
                "tools",
            )
        name, schema, desc = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools.{j}: a tool needs a string 'name'", "tools")
        if not isinstance(schema, dict):
            raise bad_request(f"tools.{j}: input_schema must be an object", "tools")
        if desc is not None and not isinstance(desc, str):
            raise bad_request(f"tools.{j}: description must be a string", "tools")
        function: dict[str, Any] = {"name": name}
        if desc is not None:
            function["description"] = desc
        function["parameters"] = schema
        out.append({"type": "function", "function": function})
    return out or None


def tool_choice_tools(tools: list[dict] | None, choice: Any) -> list[dict] | None:
    """`auto` (the default) shows the tools, `none` hides them; `any` and a named tool show
    them and force a call (`forced_choice`)."""
    if choice is None:
        return tools
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "any", "tool"):
        return tools
    if kind == "none":
        return None
    raise bad_request(
        "tool_choice must be an object with type 'auto', 'none', 'any' or 'tool'", "tool_choice"
    )


def thinking_args(thinking: Any) -> dict[str, Any]:
    """`thinking` -> `enable_thinking` for Qwen3-style templates (others ignore it)."""
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind is not None and (budget := thinking.get("budget_tokens")) is not None:
        check("thinking.budget_tokens", integer(budget), int, lo=0)  # whatever the type
    if kind in ("enabled", "adaptive"):
        return {"enable_thinking": True}
    if kind == "disabled":
        return {"enable_thinking": False}
    raise bad_request(
        "thinking must be an object with type 'enabled', 'adaptive' or 'disabled'", "thinking"
    )


def check_output_config(config: Any) -> None:
    """`output_config`'s shape; `effort` is a hint this server has nothing to map to, so it is
    accepted; `format` (structured outputs) is enforced (`constrain`)."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise bad_request("output_config must be an object", "output_config")
    if not isinstance(config.get("effort"), str | None):
        raise bad_request("output_config.effort must be a string", "output_config")


def constrain(params: GenParams, body: dict[str, Any], tools: list[dict] | None) -> None:
    """`output_config.format` and `tool_choice` any / tool as the row's constraint (a 400
    naming the field when bad, or when both are asked for)."""
    from ..constrain import ConstraintError, from_response_format
    from .text import forced_tool

    fmt = (body.get("output_config") or {}).get("format")
    try:
        params.constraint = from_response_format(fmt, "output_config.format")
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from e
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("any", "tool"):
        return
    if params.constraint is not None:
        raise bad_request(
            "tool_choice cannot force a call with output_config.format", "tool_choice"
        )
    as_openai = "required" if kind == "any" else {"function": {"name": choice.get("name")}}
    params.constraint, params.forced_tool = forced_tool(tools, as_openai)


def convert_request(
    body: dict[str, Any], server_template_args: dict[str, Any], media: MediaPolicy = DEFAULT_POLICY
) -> Conversation:
    """The template inputs of a `/v1/messages` or `/v1/messages/count_tokens` body; a user
    turn's image blocks are images within `media`, the server's limits (anthropic_messages.py)."""
    check_output_config(body.get("output_config"))
    reader = MediaReader(media)
    messages = convert_messages(body.get("messages"), body.get("system"), reader)
    tools = tool_choice_tools(convert_tools(body.get("tools")), body.get("tool_choice"))
    template_args = {**server_template_args, **thinking_args(body.get("thinking"))}
    last = messages[-1]
    prefill = last["role"] == "assistant"
    if prefill and last.get("tool_calls"):
        raise bad_request(
            "the last message is an assistant turn with tool_use blocks; send the results "
            "as tool_result blocks in a user turn",
            "messages",
        )
    return Conversation(messages, tools, template_args, prefill)


def render(tokenizer: Any, conv: Conversation) -> Prompt:
    """The prompt tokens, as the OpenAI endpoint renders them; a prefill continues the last
    assistant turn (the template's `continue_final_message`) instead of opening a new one."""
    return chat_prompt(
        tokenizer, conv.messages, conv.tools, conv.template_args, prefill=conv.prefill
    )


def stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise bad_request("stop_sequences must be a list of strings", "stop_sequences")
    return [w for w in value if w]


def integer(value: Any) -> Any:
    """An integral float (`5.0`) as the int it is (JSON Schema and Anthropic accept it)."""
    if isinstance(value, float) and value.is_integer() and -INT64 <= value < INT64:
        return int(value)
    return value  # 1e19 stays a float: refused as not an integer, never past 64 bits


def read_params(body: dict[str, Any], defaults: Any) -> GenParams:
    """max_tokens (required), temperature, top_p, top_k, stop_sequences; the server's sampling
    defaults (`--temp`, `--top-p`, `--top-k`, `--min-p`) for what the request leaves out."""

    def g(key: str, default: Any = None) -> Any:
        value = body.get(key)
        return default if value is None else value

    if body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", "max_tokens")
    if not isinstance(body.get("metadata"), dict | None):
        raise bad_request("metadata must be an object", "metadata")
    return GenParams(
        max_tokens=check("max_tokens", integer(body["max_tokens"]), int, lo=1),
        temperature=check("temperature", g("temperature", defaults.temp), NUM, lo=0),
        top_p=check("top_p", g("top_p", defaults.top_p), NUM, lo=0, hi=1),
        top_k=check("top_k", integer(g("top_k", defaults.top_k)), int, lo=0),
        min_p=defaults.min_p,
        stop=stop_sequences(body.get("stop_sequences")),
        speculative=speculative(body),
    )


def model_name(body: dict[str, Any]) -> str:
    name = body.get("model")
    if name is None:
        raise bad_request("model: Field required", "model")
    if not isinstance(name, str):
        raise bad_request("model must be of type str", "model")
    return name
