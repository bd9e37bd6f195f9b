"""Anthropic `system` + `messages` in the shape the chat template knows: OpenAI-style chat
messages (the rules are listed in anthropic_convert.py's docstring)."""

from typing import Any

from .errors import bad_request
from .media import MediaReader
from .media_parts import ImagePart

ROLES = ("user", "assistant")
_UNSUPPORTED_BLOCKS = {
    "image": "images are not supported by this server (content block type 'image')",
    "document": "documents are not supported by this server (content block type 'document')",
}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}.content.{j}: a content block must be an object with a type")
    return content


def _refuse_block(kind: str, where: str) -> None:
    message = _UNSUPPORTED_BLOCKS.get(kind, f"content block type '{kind}' is not supported here")
    raise bad_request(f"{where}: {message}")


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad_request(f"{where}: a text block needs a string 'text'")
    return text


def system_message(system: Any) -> dict[str, Any] | None:
    if system is None:
        return None
    if isinstance(system, str):
        return {"role": "system", "content": system} if system else None
    if not isinstance(system, list):
        raise bad_request("system must be a string or a list of text blocks", "system")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise bad_request(f"system.{j}: only text blocks are supported in system", "system")
        texts.append(_text(block, f"system.{j}"))
    return {"role": "system", "content": "\n".join(texts)} if texts else None


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: tool_result content must be a string or a list of blocks")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            _refuse_block(str(kind), f"{where}.content.{j}")
        texts.append(_text(part, f"{where}.content.{j}"))
    return "\n".join(texts)


def image_block(block: dict[str, Any], at: str, reader: MediaReader) -> ImagePart:
    """An `image` block: `source` base64, or a url under the server's fetch rule."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        pending = reader.base64(source.get("media_type"), source.get("data"), f"{at}.source")
    elif kind == "url":
        pending = reader.url(source.get("url"), f"{at}.source.url")
    else:
        raise bad_request(f"{at}.source: an image source must be of type 'base64' or 'url'")
    return ImagePart(pending)


def _user_turn(content: Any, where: str, reader: MediaReader | None) -> list[dict[str, Any]]:
    """A user turn: its text, with each tool_result as a `tool` message in its place; with a
    `reader`, its image blocks as image placeholders beside its text (media_parts.py)."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if any(isinstance(p, ImagePart) for p in parts):
            out.append({"role": "user", "content": list(parts)})
        elif parts:
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        parts.clear()

    for j, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}.content.{j}", block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image" and reader is not None:
            parts.append(image_block(block, at, reader))
        elif kind == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str):
                raise bad_request(f"{at}: a tool_result block needs a string 'tool_use_id'")
            if not isinstance(block.get("is_error", False), bool | None):
                raise bad_request(f"{at}: is_error must be a boolean")
            flush()
            text = _tool_result_text(block, at)
            out.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
        else:
            _refuse_block(kind, at)
    flush()
    return out or [{"role": "user", "content": ""}]


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}.content.{j}", block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{at}: a thinking block needs a string 'thinking'")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted reasoning of another model: nothing a template can render
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise bad_request(f"{at}: a tool_use block needs a string 'id' and 'name'")
            if not isinstance(args, dict):
                raise bad_request(f"{at}: a tool_use block's 'input' must be an object")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            calls.append(call)
        else:
            _refuse_block(kind, at)
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _has_image(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "image" for b in content
    )


def convert_messages(
    messages: Any, system: Any = None, reader: MediaReader | None = None
) -> list[dict[str, Any]]:
    """Anthropic `system` + `messages` -> OpenAI-style chat messages; `reader` (the server's
    image limits) takes user turns' image blocks, else they are refused."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    if (sys := system_message(system)) is not None:
        out.append(sys)
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise bad_request(f"{where}: a message must be an object", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}: role must be 'user' or 'assistant'", "messages")
        if "content" not in m:
            raise bad_request(f"{where}: content is required", "messages")
        if role == "user":
            out.extend(_user_turn(m["content"], where, reader))
        elif reader is not None and _has_image(m):
            raise bad_request(f"{where}: images are taken in user messages only", "messages")
        else:
            out.append(_assistant_turn(m["content"], where))
    return out
