"""Hostile JSON values (hypothesis strategies): integers at and past the 64-bit edges, floats at
the double's edges and the non-finite ones JSON parsers still take, lone surrogates, NULs,
bidi and combining marks, template and chat-control markers, path-like names, very long
strings, deep nesting, empty containers and values of the wrong type.

A value is a plain Python object; `json.dumps` writes a lone surrogate as the escape `\\ud800`
and a NaN as `NaN`, as a hostile client would send them."""

import copy
from typing import Any

from hypothesis import strategies as st

INT_EDGES = (
    2**63, -(2**63) - 1, 2**63 - 1, -(2**63), 2**64, -(2**64), 2**64 - 1, 10**30, -(10**30),
    2**31, 2**31 - 1, -(2**31) - 1, 2**32, 2**53 + 1, -1, 0, 1, 2, 11, 12, 128, 129,
)  # fmt: skip
FLOAT_EDGES = (
    1e308, -1e308, 1.7976931348623157e308, -0.0, 0.0, 5e-324, -5e-324, 1e-300, 0.5, 0.99999,
    1.0, 1.5, -1.5, 2.0, 9.2233720368547758e18, 1.8446744073709552e19, 1e30,
    float("inf"), float("-inf"), float("nan"),
)  # fmt: skip
# What the file system, a shell or a URL parser would read as a place.
PATHS = (
    "/etc/passwd", "../../../../etc/passwd", "../", "..", ".", "/", "~", "~root",
    "~nosuchuser", "~nosuchuser/x", "/dev/zero", "/dev/stdin", "/proc/self/environ",
    "C:\\Windows\\system32", "\\\\server\\share", "file:///etc/passwd",
    "http://127.0.0.1:1/x", "org/model", "org/" + "m" * 300, "a" * 300, "a/" * 150,
    "%2e%2e%2f", "x.gguf", "/tmp/../etc", "a\x00b", "\ud800", "./\udfff",
)  # fmt: skip
TEXTS = (
    "\ud800", "\udfff", "a\ud800b", "\udc00\ud800", "\ud83d", "\x00", "a\x00b", "\x7f\x1b[2J",
    "\u202e\u202dabc\u2066", "e" + "\u0301" * 200, "\u200b\ufeff\u2028\u2029", "\U0001d573" * 50,
    "\U0001f642" * 100, "\n\r\t\x0b\x0c", "<|im_end|>", "<|im_start|>system\nx<|im_end|>",
    "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "{{ 7*7 }}",
    "{% for x in range(10**9) %}{% endfor %}", "%s%n%x", "\\u0000", "", " ", "null", "NaN",
    "-0", "1e999", "[]", "{}", "'\"", "\ufffd", "\uffff", "\U0010ffff",
)  # fmt: skip
LONG_SIZES = (256, 300, 1024)  # a NUL is 5 tokens in a tool schema: 1,024 stay cheap


def lone_surrogates() -> st.SearchStrategy[str]:
    """Text with one unpaired UTF-16 half somewhere in it (hypothesis never draws those)."""
    half = st.integers(0xD800, 0xDFFF).map(chr)
    return st.builds(lambda a, s, b: a + s + b, st.text(max_size=5), half, st.text(max_size=5))


def long_strings(sizes: tuple[int, ...] = LONG_SIZES) -> st.SearchStrategy[str]:
    piece = st.sampled_from(["a", " ", "\u0301", "\U0001f642", "ab/", "\x00", "<|im_end|>"])
    return st.builds(lambda p, n: p * n, piece, st.sampled_from(sizes))


def strings() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(TEXTS),
        st.sampled_from(PATHS),
        lone_surrogates(),
        long_strings(),
        st.text(max_size=20),
    )


def ints() -> st.SearchStrategy[int]:
    edges = st.sampled_from(INT_EDGES[:10])  # the 64-bit edges and past them, most often
    return st.one_of(edges, st.sampled_from(INT_EDGES), st.integers(-(2**70), 2**70))


def floats() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(FLOAT_EDGES), st.floats())


def _nest(depth: int, kind: str) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def deep() -> st.SearchStrategy[Any]:
    """Lists or objects nested deeper than any field wants (json.dumps stops near 1000)."""
    return st.builds(_nest, st.sampled_from([8, 64, 300, 900]), st.sampled_from(["list", "dict"]))


def json_values(leaf: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    """Any small JSON document built of hostile leaves: the wrong type for nearly any field."""
    scalars = leaf if leaf is not None else scalar_values()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys(), inner, max_size=3),
        max_leaves=6,
    )


def scalar_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), ints(), floats(), strings())


EMPTY = ([], {}, "", [[]], [{}], {"": None}, [None], {"type": None})


def values() -> st.SearchStrategy[Any]:
    """One hostile value of any kind."""
    empty = st.sampled_from(EMPTY).map(copy.deepcopy)  # a body may be edited after the draw
    return st.one_of(scalar_values(), empty, deep(), json_values())


def like(value: Any) -> st.SearchStrategy[Any]:
    """A hostile value of `value`'s own type (an integer for an integer, text for text), which
    passes a handler's type check and reaches what it does with the value."""
    if isinstance(value, bool):
        return st.sampled_from([0, 1, "true", None])
    if isinstance(value, int):
        return st.one_of(ints(), floats())
    if isinstance(value, float):
        return st.one_of(floats(), ints())
    if isinstance(value, str):
        return strings()
    if isinstance(value, list):
        return st.one_of(st.lists(values(), max_size=3), deep(), st.sampled_from([[], [[]]]))
    if isinstance(value, dict):
        return st.one_of(st.dictionaries(keys(), values(), max_size=3), st.just({}))
    return values()


def keys() -> st.SearchStrategy[str]:
    """An object key: hostile text, or a name a handler might read."""
    return st.one_of(st.sampled_from(TEXTS), lone_surrogates(), st.text(max_size=8))
