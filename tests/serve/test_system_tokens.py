"""The system-prompt cut (prefix-store snapshot point) with its tokenization cached: the cut is
mlx_lm.server's on a miss and on a hit, and a hit never returns a stale rendering."""

import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlxd.serve.prompt import SystemTokens, chat_prompt

PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": PARAMS}}]


def mlx_lm_segments(tok: Any, messages: list[dict], tools: Any, kwargs: dict) -> tuple:
    """mlx_lm.server's own `_tokenize` (the oracle) on a chat request."""
    from mlx_lm.server import ResponseGenerator

    cli_args = SimpleNamespace(chat_template_args={})
    owner = SimpleNamespace(model_provider=SimpleNamespace(processor=None, cli_args=cli_args))
    request = SimpleNamespace(request_type="chat", messages=messages, tools=tools)
    request.role_mapping = None
    prompt, segments, types, _, _ = ResponseGenerator._tokenize(
        owner, tok, request, SimpleNamespace(chat_template_kwargs=kwargs)
    )
    return prompt, segments, types


@pytest.fixture(scope="module")
def qwen3_tok(qwen3_tokenizer_dir: Path) -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(qwen3_tokenizer_dir)


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}], ids=["think", "nothink"])
def test_cut_is_mlx_lm_servers_on_miss_and_hit(qwen3_tok: Any, tools: Any, kwargs: dict) -> None:
    system = "You are a careful coding agent. " * 200
    for turn in range(3):  # the first call fills the cache, the others hit it
        messages = [{"role": "system", "content": system}]
        for t in range(turn):
            messages += [{"role": "user", "content": f"step {t}"},
                         {"role": "assistant", "content": f"done {t}"}]  # fmt: skip
        messages.append({"role": "user", "content": f"now step {turn}"})
        prompt, segments, types = mlx_lm_segments(qwen3_tok, messages, tools, kwargs)
        ours = chat_prompt(qwen3_tok, [dict(m) for m in messages], tools, kwargs)
        assert ours.tokens == prompt
        assert types[0] == "system"
        assert ours.cuts[0] == (len(segments[0]), "system")


class Rendering:
    """A tokenizer whose template prints a value outside its inputs (as a date would be)."""

    def __init__(self) -> None:
        self.day, self.encodes = "monday", 0

    def apply_chat_template(self, messages: list[dict], tokenize: bool, **kw: Any) -> Any:
        text = self.day + "|" + "|".join(m["content"] for m in messages) + f"|{kw.get('tools')}"
        if not tokenize:
            return text
        self.encodes += 1
        return [ord(c) for c in text]


def test_hit_needs_the_same_rendering_and_inputs() -> None:
    cache, tok = SystemTokens(size=2), Rendering()
    alone = [{"role": "system", "content": "sys"}, {"role": "user", "content": ""}]
    first = cache.get(tok, alone, None, {})
    assert cache.get(tok, alone, None, {}) == first and tok.encodes == 1  # a hit: no encode
    tok.day = "tuesday"  # the template renders otherwise now: a miss, the new text's tokens
    assert cache.get(tok, alone, None, {}) == [ord(c) for c in "tuesday|sys||None"]
    assert tok.encodes == 2
    cache.get(tok, alone, TOOLS, {})  # other tools: a miss
    cache.get(tok, alone, None, {"x": 1})  # other template arguments: a miss
    assert (cache.hits, cache.misses) == (1, 4)


def test_bounded_and_dropped_with_the_tokenizer() -> None:
    cache, tok = SystemTokens(size=2), Rendering()
    for i in range(5):
        cache.get(tok, [{"role": "system", "content": str(i)}], None, {})
    assert len(cache._per_tokenizer[tok]) == 2
    del tok
    gc.collect()
    assert len(cache._per_tokenizer) == 0


def test_size_zero_turns_it_off() -> None:
    cache, tok = SystemTokens(size=0), Rendering()
    alone = [{"role": "system", "content": "sys"}]
    assert cache.get(tok, alone, None, {}) == cache.get(tok, alone, None, {})
    assert tok.encodes == 2 and (cache.hits, cache.misses) == (0, 0)
