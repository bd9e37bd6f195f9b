"""A request's tools that its model's chat template drops (SmolLM2's does): the model never
sees them, so `tool_choice: auto` never calls one. Said once per model in the log and on every
such response as an `X-Mlxd-Warning` header (chat, Responses, Messages).

Whether a template drops tools is a property of the template (and the template arguments),
not of one conversation: it is found once per tokenizer and arguments by rendering a probe
tool and looking for its name, so a request pays nothing for it."""

import json
import logging
import threading
import weakref
from typing import Any

from .provider import Served

log = logging.getLogger("mlxd.serve")

HEADER = "X-Mlxd-Warning"
PROBE_NAME = "mlxd_probe_tool_7f3a"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_lock = threading.Lock()
_drops: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()
_warned: set[str] = set()


def template_drops_tools(tokenizer: Any, template_args: dict[str, Any] | None = None) -> bool:
    """The chat template renders no tool definitions (no template: mlx-lm's role mapping,
    which has no place for them either)."""
    if not tokenizer.has_chat_template:
        return True
    args = template_args or {}
    key = json.dumps(args, sort_keys=True, default=repr)
    with _lock:
        known = _drops.setdefault(tokenizer, {}).get(key)
    if known is not None:
        return known
    messages = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True, **args
        )
        drops = PROBE_NAME not in text
    except Exception:  # noqa: BLE001 - a template refusing the probe: no claim either way
        drops = False
    with _lock:
        _drops[tokenizer][key] = drops
    return drops


def tools_warning(
    served: Served, tools: list[dict] | None, template_args: dict[str, Any] | None
) -> dict[str, str]:
    """The header for a response to a request with `tools` (none when they reach the prompt)."""
    if not tools or not template_drops_tools(served.tokenizer, template_args):
        return {}
    text = f"tools not in prompt: {served.name}'s chat template drops them"
    with _lock:
        first = served.name not in _warned
        _warned.add(served.name)
    if first:
        log.warning("%s; requests with tools get no tool calls from this model", text)
    # HTTP header values are latin-1: other characters of a name are written as escapes
    return {HEADER: text.encode("latin-1", "backslashreplace").decode("latin-1")}
