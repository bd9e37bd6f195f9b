"""OpenAI response pieces as JSON: tool calls and logprobs (mlx_lm.server's fields plus the
OpenAI ones, so both kinds of client parse them)."""

import math
from typing import Any

from .generation import TokenInfo
from .params import GenParams
from .textstream import ToolCall


def tool_call_json(call: ToolCall, index: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "function": {"name": call.name, "arguments": call.arguments},
        "type": "function",
        "id": call.id,
    }
    if index is not None:
        out["index"] = index
    return out


def logprobs_json(tokens: list[TokenInfo], tokenizer: Any, params: GenParams) -> dict | None:
    """mlx_lm.server's shape ({id, logprob}, top entries {id, token, logprob}), with the OpenAI
    fields `token` and `top_logprobs` on every entry so OpenAI clients parse it too."""
    if not params.logprobs and params.top_logprobs <= 0:
        return None
    content = []
    for t in tokens:
        entry: dict[str, Any] = {"id": t.id, "token": tokenizer.convert_ids_to_tokens(t.id)}
        entry["logprob"] = finite(t.logprob if t.logprob is not None else _logprob_from_top(t))
        tops = t.top or []
        names = tokenizer.convert_ids_to_tokens([i for i, _ in tops]) if tops else []
        entry["top_logprobs"] = [
            {"id": i, "token": s, "logprob": finite(lp)}
            for (i, lp), s in zip(tops, names, strict=True)
        ]
        content.append(entry)
    return {"content": content}


def finite(lp: float | None) -> float | None:
    """JSON has no infinities: a banned token's -inf is OpenAI's -9999.0, NaN is null."""
    if lp is None or math.isnan(lp):
        return None
    return max(lp, -9999.0)


def _logprob_from_top(t: TokenInfo) -> float | None:
    return next((lp for i, lp in t.top or [] if i == t.id), None)
