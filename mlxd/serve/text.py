"""One choice's output text, split the way mlx_lm.server splits it: mlx-lm's TextStateMachine
routes each token's text to content, reasoning or a tool block (stop words stripped anywhere),
and closed tool blocks go through the tokenizer's tool parser.

`tool_choice` "required" or a named function (OpenAI chat) is served as vLLM serves it: the
row is constrained to JSON (`constrain.spec.from_tool_choice`), and that JSON becomes the tool
calls. A named function's output is its arguments object; "required" is a JSON array of
`{"name", "parameters"}`. The text is held back while it is generated (a half-written call is
not a call) and turned into tool calls when the row ends. A row cut off by max_tokens keeps
its text as content and finishes with `length`.
"""

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.generate import TextStateMachine

from ..constrain import ConstraintError, from_tool_choice
from .errors import bad_request

log = logging.getLogger("mlxd.serve")


@dataclass
class ToolCall:
    """A parsed tool call: `arguments` is a JSON string (ensure_ascii=False), as mlx_lm.server."""

    id: str
    name: str
    arguments: str


@dataclass
class Delta:
    """New output since the previous delta of the same choice."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


def parse_tool_calls(
    tool_parser: Any, texts: list[str], tools: list[dict] | None
) -> list[ToolCall]:
    """mlx_lm.server's ToolCallFormatter: a block the parser rejects is logged and dropped."""
    calls: list[ToolCall] = []
    for text in texts:
        try:
            parsed = tool_parser(text, tools)
        except (ValueError, json.JSONDecodeError) as e:
            log.warning("could not parse a tool call (%s: %s); dropped", type(e).__name__, e)
            continue
        for tc in parsed if isinstance(parsed, list) else [parsed]:
            args = tc.get("arguments", {})
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(ToolCall(tc.get("id") or str(uuid.uuid4()), tc["name"], args))
    return calls


class ChoiceText:
    """Feed each token's text (and its finish reason); get the clean delta to send."""

    def __init__(
        self,
        machine: TextStateMachine,
        initial: str,
        tool_parser: Any,
        tools: list[dict] | None,
        stop: list[str] | None = None,
    ) -> None:
        self.state = machine.make_state(initial)
        # Stop words also end the row when they appear in the text (mlx-lm stops only when the
        # words' standalone token ids appear, and otherwise strips them and goes on).
        self.stop, self.raw, self.stopped = stop or [], "", False
        self.current = self.prev = initial
        self.tool_parser, self.tools = tool_parser, tools
        self.tool_text = ""
        self.made_tool_call = False

    @property
    def in_tool(self) -> bool:
        return self.current == "tool"

    def _cut_at_stop(self, text: str) -> str:
        """`text` up to the end of the first stop word it completes (sets `stopped`)."""
        if not self.stop:
            return text
        start = len(self.raw)
        self.raw += text
        window = max(map(len, self.stop))
        ends = []
        for word in self.stop:
            at = self.raw.find(word, max(0, start - window))
            if at != -1 and at + len(word) > start:
                ends.append(at + len(word))
        if not ends:
            return text
        self.stopped = True
        return text[: min(ends) - start]

    def feed(self, text: str, finish: str | None) -> Delta:
        """On "stop" the held-back text is dropped (mlx-lm's discard); on "length" flushed."""
        if finish != "stop":
            text = self._cut_at_stop(text)
            if self.stopped:
                delta = self._feed(text, None)
                more = self._feed("", "stop")
                delta.content += more.content
                delta.reasoning += more.reasoning
                delta.tool_calls += more.tool_calls
                return delta
        return self._feed(text, finish)

    def _feed(self, text: str, finish: str | None) -> Delta:
        if finish == "stop":
            self.state, self.current = TextStateMachine.discard(self.state)
            segments = [(self.current, "")]
        else:
            self.state, segments = TextStateMachine.split(self.state, text)
            if finish is not None:
                self.state, flushed, self.current = TextStateMachine.flush(self.state)
                segments.append((self.current, flushed))
        delta, closed = Delta(), []
        for state, clean in segments:
            if state == "reasoning":
                delta.reasoning += clean
            elif state == "tool":
                self.tool_text += clean
            elif state == "normal":
                if self.prev == "tool":
                    closed.append(self.tool_text)
                    self.tool_text = ""
                delta.content += clean
            self.prev = self.current = state
        if finish is not None and self.prev == "tool" and self.tool_text:
            closed.append(self.tool_text)  # a tool block cut off by the end
            self.tool_text = ""
        if closed:
            self.made_tool_call = True
            delta.tool_calls = parse_tool_calls(self.tool_parser, closed, self.tools)
        return delta

    def finish_reason(self, reason: str) -> str:
        """`stop` becomes `tool_calls` when a tool block was seen (mlx_lm.server)."""
        return "tool_calls" if reason == "stop" and self.made_tool_call else reason


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
