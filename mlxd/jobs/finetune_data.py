"""Training files: JSONL in one of mlx-lm's three formats, read and checked line by line.

A fault is JobError("invalid_file", "<field> line N: ...") naming the line, found before training
starts: every example is tokenized up front (mlx-lm would do it lazily, mid-run, and a chat
template error would then end the job with no line to point at).
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlx_lm.tuner.datasets import CacheDataset, create_dataset

from .report import JobError

# mlx-lm picks the format from these keys (tuner/datasets.py create_dataset).
FORMATS = {"chat": ("messages",), "completions": ("prompt", "completion"), "text": ("text",)}


def _bad(field: str, line: int | None, why: str) -> JobError:
    where = f"{field} line {line}" if line is not None else field
    return JobError("invalid_file", f"{where}: {why}")


def _format_of(row: dict[str, Any]) -> str | None:
    for name, keys in FORMATS.items():
        if all(k in row for k in keys):
            return name
    return None


def _check_row(row: dict[str, Any], kind: str) -> str | None:
    """Why `row` of format `kind` cannot train, or None."""
    if kind == "chat":
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            return '"messages" must be a non-empty list'
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return f'"messages"[{i}] must be an object with a "role"'
        if "tools" in row and not isinstance(row["tools"], list):
            return '"tools" must be a list'
        return None
    keys = FORMATS[kind]
    for k in keys:
        if not isinstance(row[k], str):
            return f'"{k}" must be a string'
    return None


def read_jsonl(path: str, field: str) -> tuple[list[dict[str, Any]], list[int], str]:
    """The rows of `path`, the line number of each (blank lines skipped) and their format."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    kind: str | None = None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(field, None, f"cannot read {path}: {e}") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(field, n, f"not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise _bad(field, n, "not a JSON object")
        this = _format_of(row)
        if this is None:
            raise _bad(field, n, 'has none of "messages", "prompt"+"completion", "text"')
        if kind is not None and this != kind:
            raise _bad(field, n, f"{this} format, but earlier lines are {kind} format")
        kind = this
        if (why := _check_row(row, this)) is not None:
            raise _bad(field, n, why)
        rows.append(row)
        lines.append(n)
    if kind is None:
        raise _bad(field, None, "no examples")
    return rows, lines, kind


def load_examples(path: str, field: str, tokenizer: Any, mask_prompt: bool) -> CacheDataset:
    """mlx-lm's dataset for the file, every example tokenized (a fault names its line).
    `mask_prompt` is ignored for {"text"} rows, which have no prompt."""
    rows, lines, kind = read_jsonl(path, field)
    config = SimpleNamespace(mask_prompt=mask_prompt and kind != "text")
    dataset = CacheDataset(create_dataset(rows, tokenizer, config))
    for i, n in enumerate(lines):
        try:
            tokens, offset = dataset[i]
        except Exception as e:  # a chat template's own error (bad roles, bad tools)
            msg = " ".join(str(e).split())[:300] or type(e).__name__
            raise _bad(field, n, f"cannot be tokenized: {msg}") from None
        if len(tokens) < 2:
            raise _bad(field, n, "fewer than two tokens")
        if offset >= len(tokens):
            raise _bad(field, n, "nothing to train on after the prompt")
    return dataset
