"""`mlxd serve`: every `mlx_lm.server` flag with its default, plus mlxd's, grouped by layer.

The flags are `ServeConfig`'s fields (mlxd/config.py holds each one's help, type and default):
this module only turns them into argparse arguments and starts the server.
"""

import argparse
import faulthandler
from dataclasses import Field, fields
from typing import Any

from ..blas import blas_in_use
from ..config import ConfigError, ServeConfig, apply_to_process


def flag_arguments(f: Field) -> tuple[tuple[str, ...], dict[str, Any]]:
    """argparse's `add_argument` arguments for a ServeConfig field."""
    meta = f.metadata
    kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"].replace("%", "%%")}
    if "action" in meta:
        kwargs["action"] = meta["action"]
        return meta["flags"], kwargs
    kwargs["default"] = meta["text"] if "text" in meta else f.default
    for key, name in (("parse", "type"), ("choices", "choices"), ("metavar", "metavar")):
        if key in meta:
            kwargs[name] = meta[key]
    return meta["flags"], kwargs


def _field(name: str) -> Field:
    return next(f for f in fields(ServeConfig) if f.name == name)


def add_step_size_and_attention(g: Any, attention_help: str) -> None:
    """`--prefill-step-size` and `--batched-attention`, shared by `mlxd serve` and `mlxd bench
    generate` (each with its own help for the attention)."""
    for name in ("prefill_step_size", "batched_attention"):
        flags, kwargs = flag_arguments(_field(name))
        if name == "batched_attention":
            kwargs["help"] = attention_help
        g.add_argument(*flags, **kwargs)


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "serve",
        help="an OpenAI / Anthropic compatible HTTP server (drop-in for mlx_lm.server)",
        description="Serve a model over HTTP: mlx_lm.server's API, Anthropic Messages and "
        "OpenAI Responses, on one continuous-batching engine.",
        epilog=f"CPU BLAS: {blas_in_use()} (MLXD_BLAS: auto, reference or a library's path)",
    )
    groups: dict[str, Any] = {}
    for f in fields(ServeConfig):
        if "flags" in f.metadata:
            title = f.metadata["group"]
            group = groups.get(title) or groups.setdefault(title, p.add_argument_group(title))
            flags, kwargs = flag_arguments(f)
            group.add_argument(*flags, **kwargs)


def parse_config(argv: list[str]) -> ServeConfig:
    """The ServeConfig of `mlxd serve ARGV` (the embedding program's and the tests' door)."""
    from . import build_parser

    return ServeConfig.from_args(build_parser().parse_args(["serve", *argv]))


def run(args: argparse.Namespace) -> None:
    from ..serve import main  # looked up now: tests replace main.serve

    try:
        config = ServeConfig.from_args(args)
    except ConfigError as e:
        raise SystemExit(f"mlxd serve: error: {e}") from e
    apply_to_process(config)
    # A native crash (MLX, CUDA) prints every thread's Python stack to stderr: the log then says
    # which thread was in which call.
    try:
        faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file (an IDE's console)
        pass
    main.serve(config, scan=_ready_models)


def _ready_models() -> list[str]:
    """`--models auto`: what `mlxd models` lists as ready (the scan is the CLI's)."""
    from .models_scan import READY, local_models

    return [m.name for m in local_models() if m.state == READY]
