"""`mlxd serve`: load the model, build the app, run uvicorn until interrupted."""

import logging

from ..config import ServeConfig
from ..model import ModelLoadError
from .app import ServerState, build_app
from .metrics import Metrics
from .provider import ModelProvider

log = logging.getLogger("mlxd.serve")


def make_state(config: ServeConfig) -> ServerState:
    """The server's state for `config`, its model loaded and its engine started. Resolves the
    engine's settings for this machine (`config.resolved()`): call it after
    `mlxd.config.apply_to_process(config)`, which `mlxd serve` does first."""
    if config.draft_model is not None:
        raise ModelLoadError("--draft-model: speculative decoding is not supported by mlxd yet")
    config = config.resolved()
    state = ServerState(config, ModelProvider(config))
    state.metrics = Metrics(state)
    return state


def serve(config: ServeConfig) -> None:
    import uvicorn

    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.INFO),
        format="%(asctime)s - %(levelname)s - %(message)s",
    )
    state = make_state(config)
    app = build_app(state)
    log.info("serving %s on http://%s:%d", state.provider.default.name, config.host, config.port)
    try:
        uvicorn.run(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level.lower(),
            loop=config.loop,
            http=config.http,
        )
    finally:
        state.provider.close()
