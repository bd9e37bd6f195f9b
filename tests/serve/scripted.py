"""A model that says what the test scripts: the tiny qwen3 model's forward pass (so caches
behave as usual) with its last logits forced onto the scripted tokens, then EOS. Lets HTTP
tests drive tool calls, think blocks and stop words through a real tokenizer and template."""

import dataclasses
from typing import Any

import mlx.core as mx

from mlxd.engine import Engine


class ScriptedModel:
    def __init__(self, inner: Any, eos: int) -> None:
        self.inner, self.eos = inner, eos
        self.script: list[int] = []
        self.prompt_len = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def say(self, tokens: list[int], prompt_len: int) -> None:
        self.script, self.prompt_len = list(tokens), prompt_len

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        logits = self.inner(inputs, cache=cache, **kwargs)
        k = cache[0].offset - self.prompt_len  # index of the token these logits predict
        if k < 0:
            return logits  # still inside the prompt
        token = self.script[k] if k < len(self.script) else self.eos
        vocab = logits.shape[-1]
        bias = mx.where(mx.arange(vocab) == token, 0.0, -1e9).astype(logits.dtype)
        return logits + bias


def script_server(live: Any) -> ScriptedModel:
    """Swap the live server's served model for a scripted one (a fresh engine, batch 1 so the
    row stays on serial caches whose offset is an int)."""
    provider = live.state.provider
    served = provider.default
    scripted = ScriptedModel(served.model, min(served.tokenizer.eos_token_ids))
    engine = Engine(scripted, batch=1, tokenizer=served.tokenizer)
    served.engine.close()
    provider.default = dataclasses.replace(served, model=scripted, engine=engine)
    return scripted


def chat_prompt_len(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Prompt length as the Qwen3 template renders it (transformers, not mlxd's code)."""
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, return_dict=False
    )
    return len(ids)
