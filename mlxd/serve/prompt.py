"""Chat messages to prompt tokens, as mlx_lm.server builds them: text parts joined, assistant
tool-call arguments parsed to dicts, the tokenizer's chat template with the server's and the
request's template arguments (or mlx-lm's legacy role mapping when there is no template).

The system messages rendered alone (the cut mlx_lm.server puts after the system prompt) are
tokenized once per distinct rendering: every request of an agent fleet repeats one long system
prompt, and encoding it again was about half of a request's CPU time in the server. Searches
over a prompt's tokens run at C speed (list slices and `list.index`, no Python loop per token):
a fleet's 32 prompts of ~4k tokens are built one after another under the GIL.
"""

import copy
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.server import convert_chat

from ..model.vision.media import MediaImage
from .errors import bad_request
from .media import MediaReader
from .media_parts import chat_content, images_of


@dataclass
class Prompt:
    tokens: list[int]
    initial_state: str  # where the text state machine starts: "normal" or "reasoning"
    # Where the prefill stops to snapshot the cache for the prefix store (position, kind):
    # mlx_lm.server's segments, the end of the system prompt and the start of a think tail.
    cuts: tuple[tuple[int, str], ...] = ()
    # The decoded images, in prompt order; the messages keep `{"type": "image"}` in their place
    # for the template. Empty for text.
    images: tuple[MediaImage, ...] = ()
    text: str = ""  # with images: the templated text a vision model's processor expands


def normalize_messages(messages: Any, reader: MediaReader | None = None) -> list[dict[str, Any]]:
    """A deep copy with string contents (mlx-lm's process_message_content, text only), or a
    content list of text parts and image placeholders where a message holds images (`reader`:
    the request's image limits; media_parts.py)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string role", "messages")
        m = copy.deepcopy(m)
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = chat_content(content, i, m["role"], reader)
        elif content is None:
            m["content"] = ""
        elif not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string or a list of parts")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise bad_request(f"messages[{i}].tool_calls must be a list of objects", "messages")
        for call in calls:
            fn = call.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str) and fn["arguments"]:
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError as e:
                    raise bad_request(f"messages[{i}]: tool call arguments are not JSON") from e
        out.append(m)
    return out


def initial_state(tokenizer: Any, tokens: list[int]) -> str:
    """Reasoning when the prompt leaves a think block open (a template that starts it)."""
    state = "normal"
    if tokenizer.has_thinking:
        start, end = tokenizer.think_start_tokens, tokenizer.think_end_tokens
        if start and end and rfind(tokens, start) > rfind(tokens, end):  # rfind_think_*'s
            state = "reasoning"
    return tokenizer.response_initial_state or state


def chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict] | None,
    template_args: dict[str, Any],
    role_mapping: dict | None = None,
    prefill: bool = False,
) -> Prompt:
    """`prefill`: continue the last assistant turn (the template's `continue_final_message`,
    Anthropic's prefill) instead of opening a new one."""
    images = images_of(messages)  # decoded here, off the event loop; bad ones are a 400
    if not tokenizer.has_chat_template:
        if images:
            raise bad_request("the model has no chat template to place images in", "messages")
        tokens = tokenizer.encode(convert_chat(messages, role_mapping))
        return Prompt(tokens, "normal")
    turn = {"continue_final_message": True} if prefill else {"add_generation_prompt": True}
    try:
        tokens = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=True, **turn, **template_args
        )
    except Exception as e:  # noqa: BLE001 - a template rejecting the conversation is the caller's
        raise bad_request(f"the chat template rejected the messages: {e}", "messages") from e
    if isinstance(tokens, dict):  # some tokenizers return a BatchEncoding
        tokens = tokens["input_ids"]
    tokens = list(tokens)
    if images:  # the processor expands each image's placeholder (vision_rows.py)
        text = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, **turn, **template_args
        )
        return Prompt(tokens, initial_state(tokenizer, tokens), (), images, text)
    cuts = () if prefill else segment_cuts(tokenizer, messages, tools, template_args, tokens)
    return Prompt(tokens, initial_state(tokenizer, tokens), cuts, images)


def segment_cuts(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict] | None,
    template_args: dict[str, Any],
    prompt: list[int],
) -> tuple[tuple[int, str], ...]:
    """mlx_lm.server's segments of a prompt ending in a user turn: the system messages as
    rendered alone, then the user part, then a short think tail the template opened."""
    if messages[-1].get("role") != "user":
        return ()
    cuts = []
    num_system = next((i for i, m in enumerate(messages) if m.get("role") != "system"), 0)
    sys_end = 0
    if num_system > 0:
        alone = [*messages[:num_system], {"role": "user", "content": ""}]
        try:
            sys_tokens = SYSTEM_TOKENS.get(tokenizer, alone, tools, template_args)
        except Exception:  # noqa: BLE001 - no cut is only a missed snapshot
            sys_tokens = []
        sys_end = mismatch(sys_tokens, prompt)
        if 0 < sys_end < len(prompt):
            cuts.append((sys_end, "system"))
    if tokenizer.has_thinking:
        start = tokenizer.rfind_think_start(prompt, start=len(prompt) - 11)
        if start >= 0 and sys_end < start < len(prompt):
            cuts.append((start, "user"))
    return tuple(cuts)


def text_prompt(tokenizer: Any, prompt: Any) -> Prompt:
    """`/v1/completions`: a string, encoded with special tokens (mlx_lm.server), or token ids."""
    if isinstance(prompt, str):
        return Prompt(tokenizer.encode(prompt), "normal")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return Prompt(list(prompt), "normal")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return Prompt(tokenizer.encode(prompt[0]), "normal")
    raise bad_request("prompt must be a string or a list of token ids", "prompt")


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


def mismatch(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where `a` and `b` differ within their common length; 0 when one is a
    prefix of the other (`next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 0)`)."""
    a, b = list(a), list(b)  # slices compare by value only between lists
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return 0
    lo, hi = 0, n  # a[:lo] == b[:lo]; a differs from b somewhere in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def rfind(tokens: list[int] | tuple[int, ...], sequence: Sequence[int]) -> int:
    """The last start of `sequence` in `tokens`, -1 if none: mlx-lm's
    `TokenizerWrapper._find(tokens, sequence, reverse=True)` over the whole list."""
    first, rest, found = sequence[0], tuple(sequence[1:]), -1
    last_start = len(tokens) - len(sequence)
    i = 0
    while i <= last_start:
        try:
            i = tokens.index(first, i, last_start + 1)
        except ValueError:
            break
        if tuple(tokens[i + 1 : i + len(sequence)]) == rest:
            found = i
        i += 1
    return found
