"""Cheap limits before costly work. A prompt whose text cannot fit the model's context is
refused before templating and tokenizing (which take minutes and gigabytes for a body near the
size cap), and the memory a large body took is handed back once its request is done."""

import asyncio
import ctypes
import gc
import sys
import weakref
from typing import Any

from mlx_lm.tokenizer_utils import _byte_decoder

from .errors import bad_request

# Roles whose text every chat template keeps (an assistant turn's may be cut: earlier thinking).
KEPT_ROLES = ("system", "developer", "user", "tool")
LARGE_BODY = 1 << 20  # bytes: past this, memory is handed back after the request

_longest: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_BYTE_LEVEL = frozenset(_byte_decoder())  # the 256 characters byte-level BPE spells bytes with


def longest_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes one vocabulary entry stands for, so text of n bytes is at least n / this
    tokens. Byte-level entries spell one byte per character; any other entry is counted by its
    UTF-8 length, which is never less than the bytes it stands for."""
    key = getattr(tokenizer, "_tokenizer", tokenizer)
    if key not in _longest:
        try:
            vocab = tokenizer.get_vocab()
        except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: no precheck
            return None
        _longest[key] = max((_entry_bytes(t) for t in vocab), default=0) or 1
    return _longest[key]


def _entry_bytes(entry: str | bytes) -> int:
    if isinstance(entry, bytes):
        return len(entry)
    if all(c in _BYTE_LEVEL for c in entry):
        return len(entry)
    return len(entry.encode("utf-8", "replace"))


def message_text_bytes(messages: list[dict[str, Any]]) -> int:
    """UTF-8 bytes of the text every template renders: the contents of kept roles."""
    total = 0
    for m in messages:
        content = m.get("content")
        if m.get("role") in KEPT_ROLES and isinstance(content, str):
            total += len(content.encode("utf-8"))
    return total


def check_fits(served: Any, text_bytes: int, param: str = "messages") -> None:
    """A 400 when `text_bytes` of prompt text is certainly more tokens than the context holds."""
    ctx = served.context_length
    longest = longest_token_bytes(served.tokenizer) if ctx is not None else None
    if ctx is None or longest is None:
        return
    at_least = -(-text_bytes // longest)
    if at_least >= ctx:
        raise bad_request(
            f"the prompt's text is {text_bytes} bytes, at least {at_least} tokens; the "
            f"model's context length is {ctx}",
            param,
        )


def release_memory() -> None:
    """Freed objects back to the OS: Python's cycles, then glibc's free lists (it keeps what a
    large body's many small strings took; other platforms return it themselves)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


class ReleaseAfterLargeBodies:
    """ASGI middleware: once a request whose body passed LARGE_BODY is answered, release."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.get("state", {}).get("body_bytes", 0) > LARGE_BODY:
                await asyncio.to_thread(release_memory)
