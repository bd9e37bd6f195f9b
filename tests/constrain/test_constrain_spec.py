"""Constraints from the wire formats, errors that name the problem before any prefill, the
compiled-grammar cache, and the B=1 mlx-lm logits-processor path."""

import json
import re
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxd.constrain import (
    Constraint,
    ConstraintError,
    GrammarLogitsProcessor,
    compiler_for,
    from_response_format,
    from_structured_outputs,
    from_tool_choice,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}


def test_response_format_shapes() -> None:
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}).kind == "json_object"
    chat = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    responses = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}
    assert from_response_format(chat) == from_response_format(responses)
    assert json.loads(from_response_format(chat).source) == SCHEMA


def test_structured_outputs_shapes() -> None:
    assert from_structured_outputs({"regex": "a+"}) == Constraint.regex("a+")
    assert from_structured_outputs({"choice": ["x", "y"]}).kind == "choice"
    assert from_structured_outputs({"json": json.dumps(SCHEMA)}) == Constraint.json_schema(SCHEMA)
    assert from_structured_outputs({"grammar": 'start: "a"'}).kind == "grammar"
    assert from_structured_outputs({"json_object": True}).kind == "json_object"
    compact = from_structured_outputs({"json": SCHEMA, "disable_any_whitespace": True})
    assert compact.whitespace == "compact"


def test_tool_choice() -> None:
    assert from_tool_choice([WEATHER], "auto") is None
    named = from_tool_choice([WEATHER], {"type": "function", "function": {"name": "weather"}})
    assert json.loads(named.source) == SCHEMA
    required = json.loads(from_tool_choice([WEATHER], "required").source)
    assert required["type"] == "array" and required["minItems"] == 1
    assert required["items"]["anyOf"][0]["properties"]["name"] == {
        "type": "string",
        "enum": ["weather"],
    }


@pytest.mark.parametrize(
    "call, param, words",
    [
        (lambda: from_response_format({"type": "xml"}), "response_format.type", "unknown type"),
        (
            lambda: from_response_format({"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
            "needs a schema",
        ),
        (
            lambda: from_response_format({"type": "json_schema", "json_schema": {"schema": "{"}}),
            "response_format.json_schema.schema",
            "not valid JSON",
        ),
        (lambda: from_structured_outputs({"regex": "a", "choice": ["a"]}), None, "exactly one"),
        (lambda: from_structured_outputs({"choice": []}), "structured_outputs.choice", "non-empty"),
        (lambda: from_tool_choice([WEATHER], {"function": {"name": "x"}}), "tool_choice", "'x'"),
        (lambda: from_tool_choice([], "required"), "tools", "at least one tool"),
    ],
)
def test_shape_errors_name_the_field(call: Any, param: str | None, words: str) -> None:
    with pytest.raises(ConstraintError) as e:
        call()
    assert words in str(e.value)
    if param is not None:
        assert e.value.param == param


@pytest.mark.parametrize(
    "constraint, words",
    [
        (Constraint.json_schema({"type": "strin"}), "Invalid type: strin"),
        (Constraint.json_schema({"type": "array", "minItems": "2"}), "minItems"),
        (Constraint.json_schema({"type": "string", "pattern": "[a-"}), "unclosed character class"),
        (Constraint.json_schema({"$ref": "#/$defs/missing"}), "/$defs/missing"),
        (Constraint.json_schema({"type": "string", "format": "bogus"}), "Unknown format: bogus"),
        (Constraint.json_schema({"not": {"type": "string"}}), 'Unimplemented keys: ["not"]'),
        (Constraint.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 2}), "Unsatisfiable"),
        (Constraint.regex("(a"), "unclosed group"),
        (Constraint.grammar("start: foo"), 'unknown name: "foo"'),
        (Constraint.grammar("root ::= foo"), "Rule 'foo' not found"),
    ],
)
def test_compile_errors_name_the_problem(compiler: Any, constraint: Any, words: str) -> None:
    constraint = Constraint(constraint.kind, constraint.source, param="response_format")
    with pytest.raises(ConstraintError) as e:
        compiler.compile(constraint)
    assert words in str(e.value) and str(e.value).startswith("response_format: ")


def test_compiled_grammars_are_cached_and_shared(qwen3_lm: tuple[Any, Any], compiler: Any) -> None:
    c = Constraint.json_schema({"type": "object", "properties": {"k": {"type": "boolean"}}})
    same = Constraint.json_schema(
        json.dumps({"type": "object", "properties": {"k": {"type": "boolean"}}})
    )
    assert compiler.compile(c) is compiler.compile(same)
    assert compiler_for(qwen3_lm[1]) is compiler
    # Property order is meaning (it is the output's order), so reordered keys differ.
    a = Constraint.json_schema({"properties": {"x": {}, "y": {}}})
    assert a != Constraint.json_schema({"properties": {"y": {}, "x": {}}})


@pytest.mark.parametrize(
    "constraint, check",
    [
        (Constraint.choice(["alpha", "beta", "gamma"]), lambda t: t in ("alpha", "beta", "gamma")),
        (Constraint.grammar('root ::= "on" | "off"'), lambda t: t in ("on", "off")),
        (Constraint.regex(r"[a-c]{2}[0-9]"), lambda t: re.fullmatch(r"[a-c]{2}[0-9]", t)),
    ],
)
def test_logits_processor_with_mlx_lm(
    qwen3_lm: tuple[Any, Any], compiler: Any, constraint: Any, check: Any
) -> None:
    """B=1 through mlx-lm's own generate_step, temperature 1, until EOS."""
    model, tok = qwen3_lm
    proc = GrammarLogitsProcessor(compiler.matcher(constraint))
    mx.random.seed(0)
    out = []
    steps = generate_step(
        mx.array(tok.encode("Pick one.")),
        model,
        max_tokens=16,
        sampler=make_sampler(temp=1.0),
        logits_processors=[proc],
    )
    for token, _ in steps:
        if token in tok.eos_token_ids:
            break
        out.append(token)
    else:
        pytest.fail("no EOS within 16 tokens")
    assert check(tok.decode(out)), tok.decode(out)
    assert proc.matcher.is_accepting()
