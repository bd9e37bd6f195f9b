"""The Responses API's wire format: input items -> the chat messages a template renders, flat
function tools -> chat tools, and the output items, usage and response object OpenAI's SDK parses.

Reasoning items in the input ride on the next assistant turn as `reasoning_content` (the field
chat templates such as Qwen3's read; templates without it ignore it), so a tool loop keeps its
thinking where the template wants it. A reasoning item not followed by an assistant turn is dropped.
"""

import copy
import json
import time
import uuid
from typing import Any

from .errors import bad_request
from .generation import Usage
from .media import DEFAULT_POLICY, MediaPolicy, MediaReader
from .media_parts import ImagePart
from .speculation import prediction_details
from .text import ToolCall

# Responses roles -> chat template roles (few local templates know `developer`).
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` as a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise bad_request(f"input[{i}] must be an object", "input")
        return copy.deepcopy(value)
    raise bad_request("input must be a string or a list of input items", "input")


def _text(content: Any, field: str, reader: MediaReader | None = None) -> str | list:
    """A string, or text parts joined (input_text / output_text / refusal); with a `reader`
    (a user message's content), a list of text parts and image placeholders where it holds
    `input_image` parts (media_parts.py)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{field} must be a string or a list of content parts", "input")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and reader is not None:
            parts.append(ImagePart(reader.url(part.get("image_url"), f"{field}[{j}].image_url")))
        else:
            only = "text and input_image parts" if reader is not None else "only text parts"
            raise bad_request(f"{field}: content part '{kind}' is not supported ({only})", "input")
    if any(isinstance(p, ImagePart) for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{name} must be a string", "input")
    return value


def _arguments(item: dict[str, Any], where: str) -> str:
    """Kept as the client's string; checked here so the error names the input item."""
    args = _field(item, "arguments", where)
    try:
        if args.strip():
            json.loads(args)
    except json.JSONDecodeError as e:
        raise bad_request(f"{where}.arguments is not valid JSON: {e}", "input") from e
    return args


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or []
    if not isinstance(parts, list):
        return ""
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def to_messages(
    items: list[dict[str, Any]], instructions: str | None, media: MediaPolicy = DEFAULT_POLICY
) -> list[dict[str, Any]]:
    """Chat messages for the template: instructions first as a system message; consecutive
    function_call items join the assistant turn before them; outputs become tool messages;
    a user message's `input_image` parts are images (`media`: the server's limits)."""
    reader = MediaReader(media, "input")
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    reasoning = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = _ROLES.get(role) if isinstance(role, str) else None
            if role is None:
                raise bad_request(
                    f"{where}.role must be one of user, system, developer, assistant", "input"
                )
            images = reader if role == "user" else None  # images only in user messages
            content = _text(item.get("content"), where + ".content", images)
            msg: dict[str, Any] = {"role": role, "content": content}
            if role == "assistant" and reasoning:
                msg["reasoning_content"] = reasoning
            reasoning = ""  # reasoning belongs to the assistant turn right after it, or none
            messages.append(msg)
        elif kind == "function_call":
            call = {
                "id": _field(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _field(item, "name", where),
                    "arguments": _arguments(item, where),
                },
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            if reasoning:
                last["reasoning_content"], reasoning = reasoning, ""
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            content = _text(item.get("output"), where + ".output")
            call_id = _field(item, "call_id", where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            reasoning = ""
        elif kind == "reasoning":
            reasoning += _reasoning_text(item)
        else:
            raise bad_request(f"{where}: input items of type '{kind}' are not supported", "input")
    return messages


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools -> `{type: function, function: {...}}` for templates."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"tools[{i}]: only function tools are supported, not {kind}", "tools")
        if isinstance(tool.get("function"), dict):  # already chat-shaped
            out.append({"type": "function", "function": tool["function"]})
            continue
        if not isinstance(tool.get("name"), str):
            raise bad_request(f"tools[{i}].name must be a string", "tools")
        fn: dict[str, Any] = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out or None


def flat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tools back in the Responses shape, for the response object's `tools`."""
    return [{"type": "function", "strict": None, **t["function"]} for t in tools or []]


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [output_text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def function_call_item(item_id: str, call: ToolCall, arguments: str, status: str) -> dict:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
    }


def usage_json(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    """With Chat Completions' prediction counts in `output_tokens_details` when a row drafted."""
    details = {"reasoning_tokens": reasoning_tokens}
    if usage.drafted_tokens:
        details |= prediction_details(usage.drafted_tokens, usage.accepted_tokens)
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": details,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_object(
    head: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object; `head` holds the id, created_at and the request's echoed fields."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": head["id"],
        "object": "response",
        "created_at": head["created_at"],
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        **{k: v for k, v in head.items() if k not in ("id", "created_at")},
        "output": output,
        "usage": usage,
    }
