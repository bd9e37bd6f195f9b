"""Each served model's engine in a child process (`--isolation process`, the default): a crash
in MLX ends that engine's requests with an error, and the engine is started again, while the
server keeps serving. The server keeps the tokenizer; the process the weights and the caches."""

from pathlib import Path
from typing import Any

from ...config import ServeConfig
from ..loading import ModelFacts, draft_names, load_tokenizer_only
from .remote import RemoteEngine
from .wire import facts_of


def remote_served(
    config: ServeConfig,
    name: str,
    folder: Path,
    adapter: str | None,
    held: int,
    draft: str | None,
    arrivals: Any,
) -> Any:
    """A Served whose engine runs in its own process; the load's errors are raised here."""
    from ..provider import Served, context_length  # provider builds Served with this

    init = {"config": config, "folder": folder, "adapter": adapter, "held": held, "draft": draft}
    engine = RemoteEngine(init, name, arrivals)
    try:
        tokenizer = load_tokenizer_only(config, folder)  # while the process loads the weights
        engine.wait_ready()
    except BaseException:
        engine.close()
        raise
    facts = facts_of(ModelFacts, engine.facts)
    served = Served(name, None, tokenizer, engine, context_length(folder), facts)
    if draft is not None:
        served.draft_names = draft_names(draft)
    return served


__all__ = ["RemoteEngine", "remote_served"]
