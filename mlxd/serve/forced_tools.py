"""`tool_choice` "required" or a named function (OpenAI chat), as vLLM serves it: the row is
constrained to JSON (`constrain.spec.from_tool_choice`), and that JSON becomes the tool calls.

A named function's output is its arguments object; "required" is a JSON array of
`{"name", "parameters"}`. The text is held back while it is generated (a half-written call is
not a call) and turned into tool calls when the row ends. A row cut off by max_tokens keeps
its text as content and finishes with `length`.
"""

import json
import uuid
from typing import Any

from ..constrain import ConstraintError, from_tool_choice
from .errors import bad_request
from .textstream import Delta, ToolCall


def forced_tool(tools: list[dict] | None, choice: Any) -> tuple[Any, str | None]:
    """(constraint, the named function or "required") for a forcing tool_choice, else
    (None, None); a bad one is a 400 naming the field."""
    if choice in (None, "auto", "none"):
        return None, None
    if choice != "required" and not isinstance(choice, dict):
        raise bad_request(
            "tool_choice must be 'none', 'auto', 'required' or an object", "tool_choice"
        )
    if not tools:
        raise bad_request("tool_choice 'required' or a named function needs tools", "tool_choice")
    try:
        constraint = from_tool_choice(tools, choice)
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from e
    if isinstance(choice, dict):
        return constraint, (choice.get("function") or {}).get("name") or choice.get("name")
    return constraint, "required"


class ForcedToolText:
    """ChoiceText's interface (feed / stopped / in_tool / finish_reason) for a forced call."""

    def __init__(self, forced: str) -> None:
        self.forced, self.text, self.stopped, self.calls = forced, "", False, 0

    @property
    def in_tool(self) -> bool:
        return True  # nothing streams until the call is whole

    def feed(self, text: str, finish: str | None) -> Delta:
        self.text += text
        if finish is None:
            return Delta()
        if finish != "stop":
            return Delta(content=self.text)  # cut off: the partial JSON, as text
        calls = self._calls(json.loads(self.text))
        self.calls = len(calls)
        return Delta(tool_calls=calls)

    def _calls(self, value: Any) -> list[ToolCall]:
        def call(name: str, args: Any) -> ToolCall:
            arguments = json.dumps(args, ensure_ascii=False)  # mlx_lm.server's form
            return ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, arguments)

        if self.forced != "required":
            return [call(self.forced, value)]
        return [call(c["name"], c["parameters"]) for c in value]

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if reason == "stop" and self.calls else reason
