"""What a request asks its output to match, as one value: a `Constraint`.

The wire formats name the same few things in different shapes: OpenAI `response_format`
(`json_object`, `json_schema`; the Responses API's flattened `text.format`), vLLM
`structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and `tool_choice`
(required / a named function: the arguments must match the tool's parameter schema). Each
becomes a `Constraint` here, and shape errors become a `ConstraintError` naming the field, so
the server can answer 400 before any prefill. Whether a schema or grammar *compiles* is
checked by `GrammarCompiler.compile` (it needs the tokenizer).
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "choice", "grammar")
Whitespace = Literal["bounded", "any", "compact"]
# Whitespace between JSON tokens. "any": unbounded (vLLM's default; a model, or random logits,
# can loop in it forever). "compact": none (vLLM's disable_any_whitespace). "bounded": one
# space, or a newline and up to 20 spaces/tabs of indent, per gap (llama.cpp's JSON rule):
# pretty-printed output still fits, runaway whitespace does not.
WHITESPACE: dict[str, str | None] = {
    "bounded": r"(?:\x20|\r?\n[\x20\x09]{0,20})?",
    "any": None,
    "compact": "",
}


class ConstraintError(ValueError):
    """A constraint that cannot be honoured; `param` names the request field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """One row's output constraint. `source` is canonical text (a JSON Schema as compact JSON,
    keys in their given order; a choice list as JSON; a regex or grammar as given), so equal
    constraints hash equal and share one compiled grammar."""

    kind: Kind
    source: str
    whitespace: Whitespace = "bounded"  # JSON only: what may separate tokens (WHITESPACE)
    param: str | None = field(default=None, compare=False)  # the request field, for errors

    @property
    def key(self) -> tuple[str, str, str]:
        """The part that decides the grammar (the compiled-grammar cache key)."""
        return (self.kind, self.source, self.whitespace)

    @classmethod
    def json_schema(
        cls, schema: Any, *, whitespace: Whitespace = "bounded", param: str | None = None
    ) -> "Constraint":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ConstraintError(f"the schema is not valid JSON ({e})", param) from None
        if not isinstance(schema, dict | bool):
            raise ConstraintError("a JSON Schema must be an object (or a boolean)", param)
        return cls("json_schema", _canonical(schema), _ws(whitespace, param), param)

    @classmethod
    def json_object(
        cls, *, whitespace: Whitespace = "bounded", param: str | None = None
    ) -> "Constraint":
        return cls("json_object", '{"type":"object"}', _ws(whitespace, param), param)

    @classmethod
    def regex(cls, pattern: Any, *, param: str | None = None) -> "Constraint":
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("a regex must be a non-empty string", param)
        return cls("regex", pattern, param=param)

    @classmethod
    def choice(cls, options: Any, *, param: str | None = None) -> "Constraint":
        if (
            not isinstance(options, list | tuple)
            or not options
            or not all(isinstance(o, str) and o for o in options)
        ):
            raise ConstraintError("choice must be a non-empty list of non-empty strings", param)
        return cls("choice", json.dumps(list(options), ensure_ascii=False), param=param)

    @classmethod
    def grammar(cls, text: Any, *, param: str | None = None) -> "Constraint":
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError("a grammar must be a non-empty string (Lark or GBNF)", param)
        return cls("grammar", text, param=param)


def _ws(whitespace: str, param: str | None) -> Any:
    if whitespace not in WHITESPACE:
        raise ConstraintError(f"unknown whitespace mode {whitespace!r}", param)
    return whitespace


def _canonical(schema: Any) -> str:
    # Key order is kept: llguidance emits properties in schema order, so order is meaning.
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _require_dict(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise ConstraintError("must be an object", param)
    return value


_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def from_response_format(rf: Any, param: str = "response_format") -> Constraint | None:
    """OpenAI `response_format` (Chat Completions) or `text.format` (Responses). None for
    text or when absent."""
    if rf is None:
        return None
    rf = _require_dict(rf, param)
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Constraint.json_object(param=param)
    if kind != "json_schema":
        raise ConstraintError(
            f"unknown type {kind!r} (expected text, json_object or json_schema)", f"{param}.type"
        )
    # Chat Completions nests {name, schema, strict} under "json_schema"; Responses flattens it.
    body, where = (
        (rf["json_schema"], f"{param}.json_schema") if "json_schema" in rf else (rf, param)
    )
    body = _require_dict(body, where)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise ConstraintError("must match ^[a-zA-Z0-9_-]{1,64}$", f"{where}.name")
    if "schema" not in body:
        raise ConstraintError("a json_schema response format needs a schema", f"{where}.schema")
    return Constraint.json_schema(body["schema"], param=f"{where}.schema")


_SO_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def from_structured_outputs(so: Any, param: str = "structured_outputs") -> Constraint | None:
    """vLLM `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""
    if so is None:
        return None
    so = _require_dict(so, param)
    given = [k for k in (*_SO_KINDS, "json_object") if so.get(k) not in (None, False)]
    unsupported = [k for k in ("structural_tag",) if so.get(k) is not None]
    if unsupported:
        raise ConstraintError(f"{unsupported[0]} is not supported", f"{param}.{unsupported[0]}")
    if len(given) != 1:
        raise ConstraintError(
            f"exactly one of json, regex, choice, grammar, json_object must be set (got {given})",
            param,
        )
    key = given[0]
    where = f"{param}.{key}"
    ws = "compact" if so.get("disable_any_whitespace") else "bounded"
    if key == "json_object":
        return Constraint.json_object(whitespace=ws, param=where)
    if key == "json":
        return Constraint.json_schema(so[key], whitespace=ws, param=where)
    return getattr(Constraint, _SO_KINDS[key])(so[key], param=where)


def _function(tool: Any, i: int) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConstraintError("a tool needs function.name", f"tools[{i}]")
    return fn


def _parameters(fn: dict, i: int) -> dict:
    params = fn.get("parameters")
    if params is None:
        return {"type": "object", "properties": {}}
    return _require_dict(params, f"tools[{i}].function.parameters")


def from_tool_choice(tools: Any, tool_choice: Any) -> Constraint | None:
    """`tool_choice` as vLLM constrains it. A named function: the output is that function's
    arguments object. "required": the output is a JSON array of at least one
    `{"name": <a tool>, "parameters": <its arguments>}` (the server turns it into tool calls).
    "auto", "none" or absent: None (the model chooses; nothing to constrain)."""
    if tool_choice in (None, "auto", "none"):
        return None
    fns = [_function(t, i) for i, t in enumerate(tools or [])]
    if not fns:
        raise ConstraintError("tool_choice needs at least one tool", "tools")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        for i, fn in enumerate(fns):
            if fn["name"] == name:
                return Constraint.json_schema(
                    _parameters(fn, i),
                    whitespace="compact",
                    param=f"tools[{i}].function.parameters",
                )
        raise ConstraintError(f"no tool named {name!r}", "tool_choice")
    if tool_choice != "required":
        raise ConstraintError(f"unknown value {tool_choice!r}", "tool_choice")
    defs: dict[str, Any] = {}
    calls = []
    for i, fn in enumerate(fns):
        params = dict(_parameters(fn, i))
        # $refs point at the root, so every tool's $defs move to the array's root (as vLLM).
        for name, d in (params.pop("$defs", None) or {}).items():
            if name in defs and defs[name] != d:
                raise ConstraintError(f"conflicting $defs entry {name!r}", "tools")
            defs[name] = d
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [fn["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,  # a call is its name and arguments, no more
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if defs:
        schema["$defs"] = defs
    # Compact: a call's JSON is read by the server, never shown, so no whitespace between tokens.
    return Constraint.json_schema(schema, whitespace="compact", param="tools")
