"""Grammar libraries for structured outputs, measured side by side on one tokenizer: token
table build, grammar compile (cold / cached), per-token mask fill and accept at B=1 and B=8,
applying the mask to MLX logits, JSON Schema keyword coverage and bad-schema errors.

    python -m bench.probes.constrain [--tokenizer DIR] [--libs llguidance,xgrammar] [--json OUT]

xgrammar needs torch, so it is measured from an environment that has it, e.g.
    PYTHONPATH=. /tmp/xgr-venv/bin/python -m bench.probes.constrain --libs xgrammar
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.probes.constrain_libs import LIBS

_DEFAULT_TOKENIZER = Path(".cache/test-fixtures/tokenizer-qwen3-3.7.2")

_PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}
_PERSON_DOC = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["a", "c"]}
_BIG = {  # a 40-field form: compile-time stress
    "type": "object",
    "properties": {f"field_{i}": {"type": ["string", "integer", "null"]} for i in range(40)},
    "required": [f"field_{i}" for i in range(40)],
    "additionalProperties": False,
}
_BIG_DOC = {f"field_{i}": (i if i % 3 else f"v{i}") for i in range(40)}
# (name, kind, source, a valid output the per-token loop replays)
CASES: list[tuple[str, str, Any, str]] = [
    ("person", "json", _PERSON, json.dumps(_PERSON_DOC, indent=2)),
    ("form40", "json", _BIG, json.dumps(_BIG_DOC)),
    ("any_json", "json_object", None, json.dumps({"k": [1, 2, {"x": "text " * 20}], "z": None})),
    ("regex", "regex", r"[0-9]{3}-[0-9]{3}-[0-9]{4}", "555-123-4567"),
    ("choice", "choice", ["positive", "negative", "neutral"], "neutral"),
]
# JSON Schema keywords the issue asks for, each as a small schema: does it compile?
COVERAGE: dict[str, Any] = {
    "nested objects": {"type": "object", "properties": {"a": {"type": "object"}}},
    "minItems/maxItems": {"type": "array", "minItems": 1, "maxItems": 3},
    "enum": {"enum": ["a", 1, None]},
    "const": {"const": {"a": 1}},
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    "allOf": {"allOf": [{"type": "object"}, {"required": ["a"]}]},
    "required + additionalProperties false": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "pattern": {"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
    "format date-time": {"type": "string", "format": "date-time"},
    "format email": {"type": "string", "format": "email"},
    "format uuid": {"type": "string", "format": "uuid"},
    "minimum/maximum": {"type": "number", "minimum": -1.5, "maximum": 2},
    "exclusiveMinimum": {"type": "integer", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "$ref recursive": {
        "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
        "$ref": "#/$defs/n",
    },
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}]},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "not": {"not": {"type": "string"}},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
}
BAD: dict[str, Any] = {
    "type typo": {"type": "strin"},
    "minItems not int": {"type": "array", "minItems": "2"},
    "bad regex pattern": {"type": "string", "pattern": "[a-"},
    "dangling $ref": {"$ref": "#/$defs/missing"},
    "unknown format": {"type": "string", "format": "bogus"},
    "unsatisfiable bounds": {"type": "integer", "minimum": 5, "maximum": 2},
}


def _us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "mean_us": round(statistics.fmean(s) * 1e6, 1),
        "p50_us": round(s[len(s) // 2] * 1e6, 1),
        "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6, 1),
    }


def _compile_times(lib: Any) -> dict[str, Any]:
    out = {}
    for name, kind, source, _ in CASES:
        t = time.perf_counter()
        compiled = lib.compile(kind, source)
        cold = time.perf_counter() - t
        lib.cached(kind, source)
        t = time.perf_counter()
        lib.cached(kind, source)
        cached = time.perf_counter() - t
        m = lib.matcher(compiled)
        mask = np.full((1, (lib.vocab + 31) // 32), -1, dtype=np.int32)
        t = time.perf_counter()
        lib.fill(m, mask, 0)
        first = time.perf_counter() - t
        out[name] = {
            "compile_cold_ms": round(cold * 1e3, 2),
            "compile_cached_ms": round(cached * 1e3, 3),
            "first_mask_ms": round(first * 1e3, 2),
        }
    return out


def _per_token(lib: Any, hf: Any, batch: int, rounds: int) -> dict[str, Any]:
    """Replay valid outputs: per step, fill every row's mask then accept its next token."""
    streams = [(lib.cached(k, s), hf.encode(text)) for _, k, s, text in CASES]
    rows = [[streams[i % len(streams)], None, 0] for i in range(batch)]  # stream, matcher, pos
    mask = np.full((batch, (lib.vocab + 31) // 32), -1, dtype=np.int32)
    fills, accepts = [], []
    for _ in range(rounds):
        for r in rows:
            if r[1] is None or r[2] >= len(r[0][1]):
                r[1], r[2] = lib.matcher(r[0][0]), 0
        ms = [r[1] for r in rows]
        t = time.perf_counter()
        if batch == 1:
            lib.fill(ms[0], mask, 0)
        else:
            lib.fill_batch(ms, mask)
        fills.append(time.perf_counter() - t)
        t = time.perf_counter()
        for r in rows:
            assert lib.accept(r[1], r[0][1][r[2]]), "replayed token rejected"
            r[2] += 1
        accepts.append(time.perf_counter() - t)
    return {"fill": _us(fills), "accept_all_rows": _us(accepts)}


def _apply_times(vocab: int, logits_vocab: int) -> dict[str, Any]:
    import mlx.core as mx

    from mlxd.constrain.mask import apply_bitmask

    out = {}
    for b in (1, 8):
        logits = mx.random.normal((b, logits_vocab))
        mask = np.full((b, (vocab + 31) // 32), -1, dtype=np.int32)
        mx.eval(logits)
        # The step's own log-softmax over the same logits: the unconstrained cost it adds to.
        steps = {
            "apply": lambda: apply_bitmask(logits, mask),  # noqa: B023
            "logsumexp_baseline": lambda: logits - mx.logsumexp(logits, -1, keepdims=True),  # noqa: B023
        }
        for name, f in steps.items():
            ts = []
            for _ in range(50):
                t = time.perf_counter()
                mx.eval(f())
                ts.append(time.perf_counter() - t)
            out[f"{name} B={b}"] = _us(ts)
    return out


def run(tokenizer: Path, libs: list[str], rounds: int, threads: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer))
    eos = [hf.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    report: dict[str, Any] = {"tokenizer": str(tokenizer), "vocab": len(hf), "threads": threads}
    for name in libs:
        t = time.perf_counter()
        lib = LIBS[name](hf, eos, threads)
        r: dict[str, Any] = {"tokenizer_info_s": round(lib.tokenizer_s, 2)}
        r["init_s"] = round(time.perf_counter() - t, 2)
        r["compile"] = _compile_times(lib)
        r["per_token_B1"] = _per_token(lib, hf, 1, rounds)
        r["per_token_B8"] = _per_token(lib, hf, 8, rounds)
        r["coverage"] = {k: lib.error("json", s) or "ok" for k, s in COVERAGE.items()}
        r["bad_schemas"] = {k: lib.error("json", s) or "ACCEPTED" for k, s in BAD.items()}
        report[name] = r
    report["apply_bitmask_mx"] = _apply_times(len(hf), 151_936)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", type=Path, default=_DEFAULT_TOKENIZER)
    p.add_argument("--libs", default=",".join(LIBS), help="comma-separated: llguidance,xgrammar")
    p.add_argument("--rounds", type=int, default=400, help="decode steps per per-token run")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    libs = []
    for name in args.libs.split(","):
        try:
            __import__(name)
            libs.append(name)
        except ImportError as e:
            print(f"skipping {name}: {e}")
    report = run(args.tokenizer, libs, args.rounds, args.threads)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
