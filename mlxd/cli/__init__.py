"""`mlxd`: one entry point, one module per subcommand."""

import argparse
import sys

from ..model.errors import ModelLoadError
from . import bench, chat, config, convert, generate, jobs, models, quantize, serve
from .version import VersionAction

SUBCOMMANDS = {
    "generate": generate,
    "chat": chat,
    "serve": serve,
    "convert": convert,
    "quantize": quantize,
    "jobs": jobs,
    "bench": bench,
    "config": config,
    "models": models,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxd",
        description="A local LLM engine on MLX: a bit-exact drop-in for mlx-lm.",
    )
    parser.add_argument("--version", action=VersionAction)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        module.add_parser(subs)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        sys.exit(2)
    try:
        SUBCOMMANDS[args.command].run(args)
    except ModelLoadError as e:
        # A bad model reference is the user's to fix: one line, no traceback.
        print(f"mlxd {args.command}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
