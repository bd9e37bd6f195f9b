"""OpenAI's completions `logprobs` shape (an integer `logprobs` asks for it): per token its
text, its log-probability, the most likely alternatives by text (the sampled token always among
them, so up to N + 1) and its character offset in the completion."""

import math
from typing import Any

from .generation import TokenInfo


def finite(lp: float | None) -> float | None:
    """JSON has no infinities: a banned token's -inf is OpenAI's -9999.0, NaN is null."""
    if lp is None or math.isnan(lp):
        return None
    return max(lp, -9999.0)


def sampled_logprob(t: TokenInfo) -> float | None:
    if t.logprob is not None:
        return t.logprob
    return next((lp for i, lp in t.top or [] if i == t.id), None)


def legacy_logprobs_json(
    tokens: list[TokenInfo], tokenizer: Any, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """The `logprobs` object of `tokens`, whose text starts `offset` characters into the
    choice's text; and the offset after them (a stream's next frame starts there)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                 "text_offset": []}  # fmt: skip
    for t in tokens:
        text = tokenizer.decode([t.id])
        lp = finite(sampled_logprob(t))
        top: dict[str, float | None] = {}
        for i, alt in t.top or []:
            top.setdefault(tokenizer.decode([i]), finite(alt))
        top.setdefault(text, lp)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset
