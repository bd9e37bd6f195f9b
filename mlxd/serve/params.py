"""What every endpoint reads from a request before it reaches the engine: the generation
fields, with mlx_lm.server's defaults and checks (its `_validate`, one 400 naming the field;
booleans are not numbers), the model (and adapter) it names, the tools `tool_choice` leaves
the template, and the fields mlxd refuses."""

import math
from dataclasses import dataclass, field
from typing import Any

from ..model import ModelLoadError
from .app import ServerState
from .errors import APIError, bad_request
from .media_parts import first_image_at, refuse_images
from .pool_specs import model_defaults
from .provider import Served
from .speculation import speculative
from .streaming import offload


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
    speculative: str | None = None  # "ngram" / "draft" / "off"; None: the server's
    prediction: str | None = None  # OpenAI's predicted output (chat): the text to draft from
    draft_model: str | None = "default_model"  # mlx_lm.server's: the served draft; null: off
    num_draft_tokens: int | None = None  # None: the server's --num-draft-tokens


NUM = (int, float)
MAX_STOP = 64  # stop strings a request may give (OpenAI takes 4; each is checked per token)
INT32 = 2**31 - 1  # MLX slices take 32-bit indices
F32_MAX = 3.4028234663852886e38  # the largest float32
MAX_TOP = 11  # top_logprobs' bound (alternatives per token)


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
    if float in kinds and abs(value) > F32_MAX:  # MLX samples in float32: it would be inf
        raise bad_request(f"{name} must be within ±{F32_MAX:.4g} (a 32-bit float)", name)
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
    if len(words) > MAX_STOP:
        raise bad_request(f"{name} takes at most {MAX_STOP} strings", name)
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
    if not all(math.isfinite(v) and abs(v) <= F32_MAX for v in bias.values()):
        raise bad_request("logit_bias values must be finite 32-bit floats", "logit_bias")
    return bias


def read_params(body: dict[str, Any], defaults: Any) -> GenParams:
    """The OpenAI / mlx-lm sampling fields of a chat or completions body; `defaults`: the
    server's (a ServeConfig's --temp, --top-p, --top-k, --min-p, --max-tokens), under the
    named model's models-file `defaults`."""
    if pooled := model_defaults(defaults, body.get("model")):
        body = {**pooled, **{k: v for k, v in body.items() if v is not None}}

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
        top_logprobs=check(
            "top_logprobs", g("top_logprobs", -1), int, lo=0, hi=MAX_TOP, allow=(-1,)
        ),
        seed=None if g("seed") is None else check("seed", g("seed"), int, lo=-(2**63), hi=2**64),
        stop=stop_words(g("stop")),
        n=check("n", g("n", 1), int, lo=1, hi=128),
    )
    for name in ("presence_penalty", "frequency_penalty"):
        if abs(getattr(p, name)) > 1e6:
            raise bad_request(f"{name} must be between -1e6 and 1e6", name)
    p.constraint = structured(body)
    p.speculative = speculative(body)
    p.draft_model = body.get("draft_model", "default_model")  # an explicit null: no drafting
    if p.draft_model is not None and not isinstance(p.draft_model, str):
        raise bad_request("draft_model must be a string or null", "draft_model")
    if (k := body.get("num_draft_tokens")) is not None:
        p.num_draft_tokens = check("num_draft_tokens", k, int, lo=0, hi=INT32)
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


def tool_choice_tools(body: dict[str, Any]) -> list[dict] | None:
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    return apply_tool_choice(tools, body.get("tool_choice"), forcing=True)


def apply_tool_choice(
    tools: list[dict] | None, choice: Any, forcing: bool = False
) -> list[dict] | None:
    """The tools the template sees (OpenAI chat and Responses). `none` hides them; `required`
    and a named function are constrained decoding: chat forces them (`forcing`), Responses
    refuses them for now."""
    if choice is None or choice == "auto":
        return tools
    if choice == "none":
        return None
    if (choice == "required" or isinstance(choice, dict)) and forcing:
        return tools  # the caller constrains the row to the call (text.py)
    if choice == "required" or isinstance(choice, dict):
        raise bad_request(
            "tool_choice 'required' and named functions need constrained decoding, which this "
            "endpoint does not support yet; use 'auto' or 'none'",
            "tool_choice",
        )
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or an object", "tool_choice")


def refuse_unsupported(body: dict[str, Any]) -> None:
    for name in ("echo", "best_of", "suffix"):
        if body.get(name) not in (None, False, 1, ""):
            raise bad_request(f"{name} is not supported", name)


MAX_NAME = 1024  # characters of a model or adapter name (a repo id is at most 96 + 96)


@dataclass(frozen=True)
class ModelRef:
    """The model (and adapter) a request names, and whether it must take images."""

    name: str = "default_model"
    adapter: str | None = None
    # where the request's first image part is: a model that takes no images refuses it
    images_at: str | None = field(default=None, compare=False)


def model_ref(body: dict[str, Any], default: str = "default_model") -> ModelRef:
    name = body.get("model")
    name = default if name is None else name
    adapter = body.get("adapters")
    if not isinstance(name, str):
        raise bad_request("model must be of type str", "model")
    if adapter is not None and not isinstance(adapter, str):
        raise bad_request("adapters must be of type str", "adapters")
    for field_name, value in (("model", name), ("adapters", adapter or "")):
        if len(value) > MAX_NAME or "\x00" in value:
            raise bad_request(f"{field_name} is not a model name", field_name)
    return ModelRef(name, adapter, first_image_at(body))


async def load_model(state: ServerState, ref: ModelRef, fallback: bool = False) -> Served:
    try:
        served = await offload(lambda: state.provider.get(ref.name, ref.adapter, fallback))
    except ModelLoadError as e:
        raise APIError(404, str(e), param="model", code="model_not_found") from e
    refuse_images(served.name, served.facts.takes_images, ref.images_at)
    return served
