"""`mlxd serve`: load the model, build the app, run uvicorn until interrupted."""

import argparse
import json
import logging
import os
from pathlib import Path

from ..model import ModelLoadError
from ..model.home import mlxd_home
from .state import ServerState

log = logging.getLogger("mlxd.serve")


def apply_config(args: argparse.Namespace, defaults: dict) -> None:
    """Options from `--config FILE` (JSON, keys as flag names); flags that differ from their
    defaults on the command line win."""
    if not args.config:
        return
    try:
        options = json.loads(Path(args.config).read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{args.config}: cannot read the config file ({e})") from e
    if not isinstance(options, dict):
        raise ModelLoadError(f"{args.config}: the config file must hold a JSON object")
    for key, value in options.items():
        dest = key.replace("-", "_")
        if dest == "decode_concurrency":
            dest = "batch"
        if dest not in defaults:
            raise ModelLoadError(f"{args.config}: unknown option '{key}'")
        if getattr(args, dest) == defaults[dest]:
            setattr(args, dest, value)


def default_batch() -> int:
    """8 rows (mlxd's cap on a Mac and the CPU); 32 on CUDA, mlx_lm.server's cap: a large GPU
    decodes 32 rows in about the time of 8 (docs/performance.md, the default row cap)."""
    import mlx.core as mx

    return 32 if mx.cuda.is_available() else 8


def make_state(args: argparse.Namespace) -> ServerState:
    from .metrics import make_metrics
    from .provider import ModelProvider

    if args.batch is None:  # after --cuda-graphs set MLX's switch: this asks MLX for CUDA
        args.batch = default_batch()

    if args.draft_model is not None:
        raise ModelLoadError("--draft-model: speculative decoding is not supported by mlxd yet")
    if args.api_key is None:
        args.api_key = os.environ.get("MLXD_API_KEY") or None
    template_args = args.chat_template_args
    if isinstance(template_args, str):  # from a config file
        try:
            template_args = json.loads(template_args)
        except ValueError as e:
            raise ModelLoadError(f"--chat-template-args is not JSON: {e}") from e
    data_dir = Path(args.data_dir) if args.data_dir else mlxd_home() / "data"
    args.data_dir = str(data_dir)
    state = ServerState(args, ModelProvider(args), template_args=template_args)
    state.metrics = make_metrics(state)
    return state


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from .app import build_app

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s - %(levelname)s - %(message)s",
    )
    state = make_state(args)
    app = build_app(state)
    log.info("serving %s on http://%s:%d", state.provider.default.name, args.host, args.port)
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level.lower(),
            loop=getattr(args, "loop", "auto"),
            http=getattr(args, "http", "auto"),
        )
    finally:
        state.provider.close()
