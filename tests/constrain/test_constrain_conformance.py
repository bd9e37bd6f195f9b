"""Conformance under adversarial logits: a tiny random-weight qwen3 model samples at
temperature 1 through the grammar masks, 8 rows a batch; every JSON output must parse and
validate (formats included), every regex output must fullmatch, every choice must be one of
the options, EOS must be allowed exactly where the output is complete (checked every step in
decode.py), and a max_tokens cut-off is reported as `length`."""

import json
import re
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from constrain.decode import decode
from constrain.schemas import CHOICES, REGEXES, SCHEMAS

from mlxd.constrain import BatchMasker, Constraint

PROMPT = "Reply with the requested format."
MAX_TOKENS = 384  # generous: the longest case needs about 160 tokens
# Random logits spend a third of their tokens on whitespace where it is allowed, so most
# schemas run compact (cheaper on 2 CPU cores); these run with the default bounded whitespace.
BOUNDED = {"object_nested", "array_of_objects", "any_of_objects", "ref_defs", "event"}
CASES: dict[str, Constraint] = {
    **{
        f"json:{k}": Constraint.json_schema(v, whitespace="bounded" if k in BOUNDED else "compact")
        for k, v in SCHEMAS.items()
    },
    **{f"regex:{k}": Constraint.regex(v) for k, v in REGEXES.items()},
    **{f"choice:{k}": Constraint.choice(v) for k, v in CHOICES.items()},
}


@pytest.fixture(scope="module")
def outputs(qwen3_lm: tuple[Any, Any], compiler: Any) -> dict[str, tuple[str, str, int]]:
    """Every case decoded once, 8 rows a batch: name -> (text, finish, eos checks)."""
    model, tok = qwen3_lm
    names = list(CASES)
    prompt = tok.encode(PROMPT)
    out = {}
    for k in range(0, len(names), 8):
        chunk = names[k : k + 8]
        matchers = [compiler.matcher(CASES[n]) for n in chunk]
        rows = decode(model, compiler, matchers, prompt, max_tokens=MAX_TOKENS, seed=k)
        for n, r in zip(chunk, rows, strict=True):
            out[n] = (tok.decode(r.tokens), r.finish, r.eos_checks)
    return out


def test_enough_schemas() -> None:
    assert len(SCHEMAS) >= 50


@pytest.mark.parametrize("name", list(CASES))
def test_output_conforms(outputs: dict[str, tuple[str, str, int]], name: str) -> None:
    text, finish, checks = outputs[name]
    assert finish == "stop", f"{name} did not finish in {MAX_TOKENS} tokens: {text[:200]!r}"
    assert checks > 0
    kind, _, key = name.partition(":")
    if kind == "regex":
        assert re.fullmatch(REGEXES[key], text), text
    elif kind == "choice":
        assert text in CHOICES[key]
    else:
        schema = SCHEMAS[key]
        jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)
        if key not in BOUNDED:  # compact: no whitespace between tokens
            assert not re.search(r"\s", _outside_strings(text)), text


# jsonschema checks date-time and time only with rfc3339-validator installed: check them here.
FORMATS = jsonschema.FormatChecker()
_RFC3339_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?"
    r"([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)


@FORMATS.checks("time")
def _time(value: object) -> bool:
    return not isinstance(value, str) or bool(re.fullmatch(_RFC3339_TIME, value))


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition("T" if "T" in value else "t")
    return bool(sep) and FORMATS.conforms(date, "date") and _time(time)


def _outside_strings(text: str) -> str:
    """The JSON text with string literals removed (whitespace inside them is content)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def test_max_tokens_cut_off_reports_length(qwen3_lm: tuple[Any, Any], compiler: Any) -> None:
    model, tok = qwen3_lm
    m = compiler.matcher(Constraint.json_schema({"type": "string", "minLength": 64}))
    (row,) = decode(model, compiler, [m], tok.encode(PROMPT), max_tokens=12, seed=1)
    assert row.finish == "length" and len(row.tokens) == 12
    assert m.error is None and not m.is_accepting()


def test_json_object(qwen3_lm: tuple[Any, Any], compiler: Any) -> None:
    """Any JSON object: random logits nest without bound, so the output either completes and
    parses as an object, or is cut off as `length` with the matcher still sound."""
    model, tok = qwen3_lm
    m = compiler.matcher(Constraint.json_object())
    (row,) = decode(model, compiler, [m], tok.encode(PROMPT), max_tokens=48, seed=2)
    text = tok.decode(row.tokens)
    assert text.startswith("{") and m.error is None
    if row.finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert len(row.tokens) == 48 and not m.is_accepting()


def test_mixed_batch_decodes(qwen3_lm: tuple[Any, Any], compiler: Any) -> None:
    """Constrained and free rows in one batch: the constrained ones still conform."""
    model, tok = qwen3_lm
    cs = [Constraint.choice(["yes", "no"]), Constraint.regex(r"[0-9]{2}-[a-z]{2}")]
    matchers = [compiler.matcher(cs[i % 2]) if i % 2 == 0 or i == 1 else None for i in range(8)]
    rows = decode(model, compiler, matchers, tok.encode(PROMPT), max_tokens=16, seed=3)
    for m, r in zip(matchers, rows, strict=True):
        text = tok.decode(r.tokens)
        if m is None:
            assert r.finish == "length" and len(r.tokens) == 16
        else:
            assert r.finish == "stop"
            assert text in ("yes", "no") or re.fullmatch(r"[0-9]{2}-[a-z]{2}", text), text


def test_mask_leaves_free_rows_bit_exact(compiler: Any) -> None:
    """B=8, rows 1, 3, 4, 6 free: their logits come back bit for bit (padded ids too);
    constrained rows keep allowed logits exactly and get -inf elsewhere, padded ids included."""
    vocab_logits = 151_936  # Qwen3's logits are wider than its 151,669-id tokenizer
    logits = mx.random.normal((8, vocab_logits), key=mx.random.key(0)).astype(mx.bfloat16)
    c = Constraint.json_schema(SCHEMAS["object_simple"])
    rows = [None if i in (1, 3, 4, 6) else compiler.matcher(c) for i in range(8)]
    rows[2].accept(compiler.tokenizer.tokenize_str('{"')[0])  # a different state per row
    masker = BatchMasker(compiler.vocab)
    mask = masker.fill(rows)
    out = masker.apply(logits, mask, rows)
    masker.close()
    assert out.dtype == logits.dtype and out.shape == logits.shape
    for i, m in enumerate(rows):
        if m is None:
            assert mx.array_equal(out[i], logits[i]).item()
            continue
        bits = np.unpackbits(mask[i].view(np.uint8), bitorder="little")[: compiler.vocab]
        ok = np.zeros(vocab_logits, dtype=bool)
        ok[: compiler.vocab] = bits.astype(bool)
        o, x = np.array(out[i].astype(mx.float32)), np.array(logits[i].astype(mx.float32))
        assert np.array_equal(o[ok], x[ok])
        assert np.all(np.isneginf(o[~ok]))
        assert 0 < ok.sum() < 1000  # a JSON object's start: a few tokens, never the vocab
