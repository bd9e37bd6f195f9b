"""The generation fields every endpoint shares, read with mlx_lm.server's defaults and checks
(its `_validate`, one 400 naming the field). Booleans are not accepted as numbers."""

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request


@dataclass
class GenParams:
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repetition_penalty: float = 0.0
    repetition_context_size: int = 20
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20
    logit_bias: dict[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    constraint: Any = None  # structured output (mlxd.constrain.Constraint), None: free text
    forced_tool: str | None = None  # tool_choice: the named function, or "required"


NUM = (int, float)
INT32 = 2**31 - 1  # MLX slices take 32-bit indices


def check(
    name: str,
    value: Any,
    kind: type | tuple[type, ...],
    lo: float | None = None,
    hi: float | None = None,
    allow: tuple = (),
) -> Any:
    """mlx_lm.server's `_validate`: type, then whitelist, then bounds."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = kinds[0].__name__ if len(kinds) == 1 else str(tuple(k.__name__ for k in kinds))
        raise bad_request(f"{name} must be of type {names}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number", name)
    if value in allow:
        return value
    if lo is not None and value < lo:
        raise bad_request(f"{name} must be at least {lo}", name)
    if hi is not None and value > hi:
        raise bad_request(f"{name} must be at most {hi}", name)
    return value


def stop_words(value: Any, name: str = "stop") -> list[str]:
    if value is None:
        return []
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise bad_request(f"{name} must be a string or a list of strings", name)
    return [w for w in words if w]


def logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("logit_bias must be of type dict", "logit_bias")
    try:
        bias = {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError, OverflowError) as e:
        raise bad_request("logit_bias must be a dict of int to float", "logit_bias") from e
    if not all(math.isfinite(v) for v in bias.values()):
        raise bad_request("logit_bias values must be finite numbers", "logit_bias")
    return bias


def read_params(body: dict[str, Any], defaults: Any) -> GenParams:
    """The OpenAI / mlx-lm sampling fields of a chat or completions body."""

    def g(key: str, default: Any = None) -> Any:
        value = body.get(key)  # an explicit null means "the default", as OpenAI treats it
        return default if value is None else value

    max_tokens = g("max_completion_tokens")
    if max_tokens is None:
        max_tokens = g("max_tokens", defaults.max_tokens)
    p = GenParams(
        max_tokens=check("max_tokens", max_tokens, int, lo=1),
        temperature=check("temperature", g("temperature", defaults.temp), NUM, lo=0),
        top_p=check("top_p", g("top_p", defaults.top_p), NUM, lo=0, hi=1),
        top_k=check("top_k", g("top_k", defaults.top_k), int, lo=0),
        min_p=check("min_p", g("min_p", defaults.min_p), NUM, lo=0, hi=1),
        # mlx-lm requires real floats for the XTC fields (an int 0 is refused there too).
        xtc_probability=check("xtc_probability", g("xtc_probability", 0.0), float, lo=0, hi=1),
        # mlx-lm's server allows up to 1, but its XTC sampler raises above 0.5 mid-step.
        xtc_threshold=check("xtc_threshold", g("xtc_threshold", 0.1), float, lo=0, hi=0.5),
        repetition_penalty=check("repetition_penalty", g("repetition_penalty", 0.0), NUM, lo=0),
        repetition_context_size=check(
            "repetition_context_size", g("repetition_context_size", 20), int, lo=0, hi=INT32
        ),
        presence_penalty=check("presence_penalty", g("presence_penalty", 0.0), NUM),
        presence_context_size=check(
            "presence_context_size", g("presence_context_size", 20), int, lo=0, hi=INT32
        ),
        frequency_penalty=check("frequency_penalty", g("frequency_penalty", 0.0), NUM),
        frequency_context_size=check(
            "frequency_context_size", g("frequency_context_size", 20), int, lo=0, hi=INT32
        ),
        logit_bias=logit_bias(g("logit_bias")),
        logprobs=check("logprobs", g("logprobs", False), bool),
        top_logprobs=check("top_logprobs", g("top_logprobs", -1), int, lo=0, hi=11, allow=(-1,)),
        seed=None if g("seed") is None else check("seed", g("seed"), int, lo=-(2**63), hi=2**64),
        stop=stop_words(g("stop")),
        n=check("n", g("n", 1), int, lo=1, hi=128),
    )
    for name in ("presence_penalty", "frequency_penalty"):
        if abs(getattr(p, name)) > 1e6:
            raise bad_request(f"{name} must be between -1e6 and 1e6", name)
    p.constraint = structured(body)
    return p


def structured(body: dict[str, Any]) -> Any:
    """OpenAI `response_format` or vLLM's `structured_outputs` (mlx_lm.server ignores both:
    mlx-lm #1007); a bad one is a 400 naming the field, before any work."""
    from ..constrain import ConstraintError, from_response_format, from_structured_outputs

    try:
        found = [
            c
            for c in (
                from_response_format(body.get("response_format")),
                from_structured_outputs(body.get("structured_outputs")),
            )
            if c is not None
        ]
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from e
    if len(found) > 1:
        raise bad_request("give response_format or structured_outputs, not both", "response_format")
    return found[0] if found else None
