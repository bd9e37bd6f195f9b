"""Checks every API endpoint runs on a request's body before it reaches the engine: the model
(and adapter) it names, the tools `tool_choice` leaves the template, fields mlxd refuses."""

from typing import Any

from ..model import ModelLoadError
from .errors import APIError, bad_request
from .offload import offload
from .provider import Served
from .state import ServerState


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
        return tools  # the caller constrains the row to the call (forced_tools.py)
    if choice == "required" or isinstance(choice, dict):
        raise bad_request(
            "tool_choice 'required' and named functions need constrained decoding, which this "
            "endpoint does not support yet; use 'auto' or 'none'",
            "tool_choice",
        )
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or an object", "tool_choice")


def refuse_unsupported(body: dict[str, Any]) -> None:
    draft = body.get("draft_model")
    if draft not in (None, "default_model"):
        raise bad_request("draft_model: speculative decoding is not supported", "draft_model")
    for name in ("echo", "best_of", "suffix"):
        if body.get(name) not in (None, False, 1, ""):
            raise bad_request(f"{name} is not supported", name)


async def load_model(state: ServerState, body: dict[str, Any], fallback: bool = False) -> Served:
    name = body.get("model", "default_model")
    adapter = body.get("adapters")
    if not isinstance(name, str):
        raise bad_request("model must be of type str", "model")
    if adapter is not None and not isinstance(adapter, str):
        raise bad_request("adapters must be of type str", "adapters")
    try:
        return await offload(lambda: state.provider.get(name, adapter, fallback))
    except ModelLoadError as e:
        raise APIError(404, str(e), param="model", code="model_not_found") from e
