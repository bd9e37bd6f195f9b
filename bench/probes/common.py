"""The probes' shared command lines (a shape of mlxd/bench/models.py's SHAPES, row counts or
a single stream's rounds) and a shape's attention dimensions."""

import argparse
from typing import Any

from mlxd.bench.models import SHAPES


def stream_parser(doc: str, rounds: int, prompt_tokens: int, gen_tokens: int) -> Any:
    """The single-stream probes' command line: --shape, --rounds, --prompt-tokens, --gen-tokens."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-host")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--prompt-tokens", type=int, default=prompt_tokens)
    p.add_argument("--gen-tokens", type=int, default=gen_tokens)
    return p


def rows_parser(doc: str, shape: str, rows: list[int]) -> Any:
    """The batched-step probes' command line: --shape and --rows (row counts to time)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=shape)
    p.add_argument("--rows", type=int, nargs="+", default=rows)
    return p


def attention_dims(shape: str) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head dim, layers) of a shape."""
    c = SHAPES[shape]
    heads = c["num_attention_heads"]
    D = c.get("head_dim") or c["hidden_size"] // heads
    return heads, c["num_key_value_heads"], D, c["num_hidden_layers"]
