"""The conformance cases: JSON Schemas covering the keywords structured outputs must honour
(nested objects, arrays with min/max items, enum, const, anyOf/oneOf, required,
additionalProperties false, string patterns and formats, numbers with bounds), plus regex
and choice cases. Names are test ids."""

from typing import Any

_S: dict[str, Any] = {"type": "string", "maxLength": 12}  # short strings keep rows short
_I: dict[str, Any] = {"type": "integer"}


def _obj(props: dict[str, Any], required: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **kw,
    }


SCHEMAS: dict[str, Any] = {
    # scalars
    "string": {"type": "string", "maxLength": 40},
    "string_len": {"type": "string", "minLength": 3, "maxLength": 8},
    # Unbounded digits only end where a non-digit may follow: numbers sit inside objects, or
    # are bounded, so random logits can end them (top-level, only EOS competes with 10 digits).
    "integer": _obj({"n": _I}),
    "integer_bounds": {"type": "integer", "minimum": -5, "maximum": 17},
    "integer_exclusive": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
    "integer_multiple": {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 700},
    "number": _obj({"x": {"type": "number"}}),
    "number_bounds": _obj({"x": {"type": "number", "minimum": 1.5, "maximum": 99.25}}),
    "number_exclusive": _obj(
        {"x": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1}}
    ),
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "type_union": _obj({"u": {"type": ["integer", "null", "boolean"]}}),
    # enum and const
    "enum_strings": {"enum": ["red", "green", "blue", "ultra violet"]},
    "enum_mixed": {"enum": ["a", 1, 2.5, None, True, {"k": [1, 2]}]},
    "const_string": {"const": "fixed value"},
    "const_object": {"const": {"a": [1, {"b": None}], "c": "d"}},
    "const_in_object": _obj({"version": {"const": 3}, "kind": {"const": "event"}, "id": _I}),
    # patterns and formats
    "pattern_phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
    "pattern_ident": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,10}$"},
    "pattern_unanchored": _obj({"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}),
    "format_date": {"type": "string", "format": "date"},
    "format_time": {"type": "string", "format": "time"},
    "format_date_time": {"type": "string", "format": "date-time"},
    "format_email": {"type": "string", "format": "email", "maxLength": 24},
    "format_uuid": {"type": "string", "format": "uuid"},
    "format_ipv4": {"type": "string", "format": "ipv4"},
    "format_object": _obj(
        {
            "when": {"type": "string", "format": "date"},
            "who": {"type": "string", "format": "email", "maxLength": 24},
        }
    ),
    # objects
    "object_simple": _obj({"name": _S, "age": {"type": "integer", "minimum": 0, "maximum": 150}}),
    "object_optional": _obj({"a": _I, "b": _S, "c": {"type": "boolean"}}, required=["a"]),
    "object_no_required": _obj({"x": _I, "y": _I}, required=[]),
    "object_nested": _obj(
        {"user": _obj({"id": _I, "profile": _obj({"nick": _S, "score": {"type": "number"}})})}
    ),
    "object_deep": _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "boolean"}})})})}),
    "object_pattern_properties": {  # extra keys named by pattern (free names never end)
        "type": "object",
        "properties": {"id": _I},
        "patternProperties": {"^x[0-9]$": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["id"],
        "additionalProperties": False,
    },
    "object_empty": {"type": "object", "additionalProperties": False},
    "object_many": _obj(
        {f"f{i}": {"type": "integer", "minimum": 0, "maximum": 99} for i in range(12)}
    ),
    # arrays
    "array_bounds": {"type": "array", "items": _I, "minItems": 2, "maxItems": 4},
    "array_exact": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3},
    "array_empty_ok": {"type": "array", "items": _S, "maxItems": 2},
    "array_of_objects": {
        "type": "array",
        "items": _obj({"k": _S, "v": {"type": "number", "minimum": 0, "maximum": 1}}),
        "minItems": 1,
        "maxItems": 3,
    },
    "array_nested": {
        "type": "array",
        "items": {"type": "array", "items": _I, "minItems": 1, "maxItems": 2},
        "minItems": 2,
        "maxItems": 3,
    },
    "array_prefix_items": {
        "type": "array",
        "prefixItems": [_S, _I, {"type": "boolean"}],
        "items": False,
    },
    "array_enum_items": {
        "type": "array",
        "items": {"enum": ["x", "y", "z"]},
        "minItems": 1,
        "maxItems": 5,
    },
    # anyOf / oneOf / $ref
    "any_of_scalars": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]},
    "any_of_objects": {
        "anyOf": [_obj({"cat": {"const": "meow"}}), _obj({"dog": {"type": "boolean"}})]
    },
    "one_of_disjoint": {
        "oneOf": [
            _obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}}),
            _obj({"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1}}),
        ]
    },
    "one_of_types": _obj({"v": {"oneOf": [{"type": "boolean"}, {"type": "null"}, _I]}}),
    "nullable_field": _obj({"maybe": {"anyOf": [_S, {"type": "null"}]}}),
    "ref_defs": {
        "$defs": {"point": _obj({"x": _I, "y": _I})},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "ref_recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                    "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                },
                "required": ["v", "next"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "all_of": {"allOf": [_obj({"a": _I}, required=["a"]), {"required": ["a"]}]},
    # realistic shapes
    "tool_call_args": _obj(
        {
            "location": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        required=["location", "unit"],
    ),
    "openai_strict_style": _obj(
        {
            "steps": {
                "type": "array",
                "items": _obj({"explanation": _S, "output": _S}),
                "maxItems": 2,
            },
            "final_answer": _S,
        }
    ),
    "event": _obj(
        {
            "title": {"type": "string", "minLength": 1, "maxLength": 16},
            "date": {"type": "string", "format": "date"},
            "tags": {"type": "array", "items": {"enum": ["work", "home"]}, "maxItems": 2},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
            "done": {"type": "boolean"},
        }
    ),
}

REGEXES: dict[str, str] = {
    "phone": r"[0-9]{3}-[0-9]{3}-[0-9]{4}",
    "ident": r"[a-zA-Z_][a-zA-Z0-9_]{0,15}",
    "date": r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "alternation": r"(yes|no|maybe)!?",
    "hex": r"0x[0-9a-f]{1,8}",
}

CHOICES: dict[str, list[str]] = {
    "yes_no": ["yes", "no"],
    "prefixes": ["a", "ab", "abc"],
    "special": ['say "hi"', "back\\slash", "naïve", "new\nline"],
}
