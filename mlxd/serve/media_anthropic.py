"""Anthropic `messages` with image blocks: anthropic_messages.py's conversion, where a user
turn's `image` blocks (`source` base64, or url under the fetch rule) become image placeholders
in its content list (media_parts.py) beside its text blocks. Images inside a tool_result stay
refused."""

from typing import Any

from .anthropic_messages import (
    ROLES,
    _assistant_turn,
    _blocks,
    _refuse_block,
    _text,
    _tool_result_text,
    convert_messages,
    system_message,
)
from .errors import bad_request
from .media import MediaReader
from .media_parts import ImagePart


def image_block(block: dict[str, Any], at: str, reader: MediaReader) -> ImagePart:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        pending = reader.base64(source.get("media_type"), source.get("data"), f"{at}.source")
    elif kind == "url":
        pending = reader.url(source.get("url"), f"{at}.source.url")
    else:
        raise bad_request(f"{at}.source: an image source must be of type 'base64' or 'url'")
    return ImagePart(pending)


def _user_turn(content: Any, where: str, reader: MediaReader) -> list[dict[str, Any]]:
    """anthropic_messages' user turn, its text blocks kept as parts beside its images."""
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
        elif kind == "image":
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


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "image" for b in content
    )


def convert_with_images(messages: Any, system: Any, reader: MediaReader) -> list[dict[str, Any]]:
    """`convert_messages`, with a user turn's image blocks read by `reader`."""
    if not isinstance(messages, list) or not any(_has_image(m) for m in messages):
        return convert_messages(messages, system)  # text only: exactly as before
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
        elif _has_image(m):
            raise bad_request(f"{where}: images are taken in user messages only", "messages")
        else:
            out.append(_assistant_turn(m["content"], where))
    return out
