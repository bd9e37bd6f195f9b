"""The system messages rendered alone (the cut mlx_lm.server puts after the system prompt),
tokenized once per distinct rendering: every request of an agent fleet repeats one long system
prompt, and encoding it again is about half of the request's CPU time in the server."""

import json
import threading
import weakref
from collections import OrderedDict
from typing import Any


class SystemTokens:
    """A small LRU per tokenizer. A hit needs the same inputs and the same rendered text (a
    template may print the date), so it returns what `apply_chat_template` would."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._per_tokenizer: weakref.WeakKeyDictionary[Any, OrderedDict] = (
            weakref.WeakKeyDictionary()
        )
        self.hits = self.misses = 0

    def get(
        self, tokenizer: Any, alone: list[dict], tools: Any, template_args: dict[str, Any]
    ) -> list[int]:
        args = {"tools": tools, "add_generation_prompt": False, **template_args}
        if self.size <= 0:  # off
            return _tokens(tokenizer.apply_chat_template(alone, tokenize=True, **args))
        text = tokenizer.apply_chat_template(alone, tokenize=False, **args)
        key = (json.dumps([alone, tools, template_args], sort_keys=True, default=repr), text)
        with self._lock:
            lru = self._per_tokenizer.setdefault(tokenizer, OrderedDict())
            tokens = lru.get(key)
            if tokens is not None:
                lru.move_to_end(key)
                self.hits += 1
                return tokens
        tokens = _tokens(tokenizer.apply_chat_template(alone, tokenize=True, **args))
        with self._lock:
            self.misses += 1
            lru[key] = tokens
            while len(lru) > self.size:
                lru.popitem(last=False)
        return tokens


def _tokens(out: Any) -> list[int]:
    return list(out["input_ids"] if isinstance(out, dict) else out)  # BatchEncoding or ids


SYSTEM_TOKENS = SystemTokens()
