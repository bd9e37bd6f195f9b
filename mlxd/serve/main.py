"""`mlxd serve`: check the port, load the model, build the app, run uvicorn until interrupted."""

import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from ..blas import blas_in_use
from ..config import ServeConfig
from ..engine.speculate.draft_model import draft_refusal
from ..model import ModelLoadError
from .app import ServerState, build_app
from .http_body import harden
from .http_limits import Limits, connection_cap, fd_limit, guarded_protocol
from .log_format import configure
from .metrics import Metrics
from .port import port_problem
from .provider import ModelProvider

log = logging.getLogger("mlxd.serve")


def make_state(config: ServeConfig, scan: Callable[[], list[str]] | None = None) -> ServerState:
    """The server's state for `config`, its model loaded and its engine started. Resolves the
    engine's settings for this machine (`config.resolved()`): call it after
    `mlxd.config.apply_to_process(config)`, which `mlxd serve` does first. `scan`: the
    local models `--models auto` serves (`mlxd models`' ready names, given by the CLI)."""
    if config.draft_model is not None and config.kv_config is not None:
        raise ModelLoadError("--kv-config does not run with --draft-model")
    if config.num_draft_tokens < 0:
        raise ModelLoadError("--num-draft-tokens must be at least 0")
    config = config.resolved()
    if "auto" in config.models and scan is None:
        raise ModelLoadError("--models auto: no local model scan was given to the server")
    provider = ModelProvider(config, scan=scan)
    try:
        provider.loras.start(config.lora_modules)  # a bad one stops start-up, naming it
    except BaseException:
        provider.close()
        raise
    facts = provider.default.facts
    why = facts.spec_refusal if config.speculative != "off" else None
    if config.speculative == "draft" and why is None:
        why = facts.draft_refusal or (None if config.draft_model else draft_refusal(None))
    if why is not None:
        provider.close()
        raise ModelLoadError(f"--speculative {config.speculative}: {why}")
    state = ServerState(config, provider)
    state.metrics = Metrics(state)
    return state


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server listens beyond this machine with no API key: with CORS `*`,
    any web page the user opens could then use the model too."""
    if api_key:
        return None
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    if local:
        return None
    return (
        f"serving on {host} without --api-key: anyone who can reach this port can use the "
        "model; set --api-key (or MLXD_API_KEY), or --host 127.0.0.1"
    )


def http_server(app: Any, config: ServeConfig) -> Any:
    """The uvicorn server `mlxd serve` runs: `app` with deadlines for a request's head and
    body, and at most --max-connections open connections (http_limits.py, http_body.py)."""
    import uvicorn

    cap = connection_cap(config.max_connections, fd_limit())
    if cap < config.max_connections:
        log.info("--max-connections %d lowered to %d: the file-descriptor limit leaves no "
                 "more room", config.max_connections, cap)  # fmt: skip
    limits = Limits(config.header_timeout, cap)
    settings = uvicorn.Config(
        harden(app, config.body_timeout),
        host=config.host,
        port=config.port,
        log_level=config.log_level.lower(),
        log_config=None,  # no handlers of uvicorn's own: its lines take --log-format too
        access_log=config.access_log,
        loop=config.loop,
        http=guarded_protocol(config.http, limits),
    )
    server = uvicorn.Server(settings)
    server.limits = limits  # type: ignore[attr-defined]
    return server


def serve(config: ServeConfig, scan: Callable[[], list[str]] | None = None) -> None:
    configure(config.log_level, config.log_format)
    if (problem := port_problem(config.host, config.port)) is not None:
        raise SystemExit(f"mlxd serve: error: {problem}")  # before the model loads: at once
    if (warning := exposure_warning(config.host, config.api_key)) is not None:
        log.warning(warning)
    state = make_state(config, scan)
    server = http_server(build_app(state), config)
    log.info("serving %s on http://%s:%d", state.provider.default.name, config.host, config.port)
    log.info("CPU BLAS: %s", blas_in_use())  # which library MLX's CPU matmuls call
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on, as uvicorn.run
        pass  # swallows it: Ctrl-C is a clean exit (status 0)
    finally:
        state.close()
    if not server.started:  # as uvicorn.run: the app's start-up failed
        raise SystemExit(3)
