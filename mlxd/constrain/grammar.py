"""A `Constraint` as llguidance grammar text (the one place that knows llguidance's formats).

llguidance takes one grammar language: a JSON Schema, a regex or a Lark grammar each become
its JSON grammar wrapper. GBNF (llama.cpp / xgrammar EBNF) is converted to Lark by
llguidance's own converter; choice becomes a Lark alternation of string literals.
"""

import json

import llguidance as llg

from .spec import WHITESPACE, Constraint, ConstraintError


def grammar_text(c: Constraint) -> str:
    """llguidance grammar text for `c`; ConstraintError when it cannot even be written down
    (compiling it, which needs the tokenizer, is `GrammarCompiler.compile`'s job)."""
    if c.kind in ("json_schema", "json_object"):
        # Defaults, as vLLM: an "x-guidance" block inside the schema may override them.
        pattern = WHITESPACE[c.whitespace]
        options: dict = {"whitespace_flexible": pattern is None}
        if pattern:
            options["whitespace_pattern"] = pattern
        try:
            return llg.LLMatcher.grammar_from_json_schema(c.source, defaults=options)
        except ValueError as e:
            raise ConstraintError(str(e), c.param) from None
    if c.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(c.source)
    if c.kind == "choice":
        # json.dumps escapes quotes, backslashes and control characters as Lark strings expect.
        options = json.loads(c.source)
        lark = "start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
        return llg.LLMatcher.grammar_from_lark(lark)
    if c.kind == "grammar":
        try:
            return llg.grammar_from("grammar", c.source)  # Lark as is; GBNF converted
        except ValueError as e:
            raise ConstraintError(str(e), c.param) from None
    raise ConstraintError(f"unknown constraint kind {c.kind!r}", c.param)
