"""`mlxd config`: every setting mlxd reads (`mlxd serve`'s flags, the engine's fields, the
environment variables) as the Markdown of docs/configuration.md."""

import argparse


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    subs.add_parser(
        "config",
        help="print every setting (flags, config file keys, environment variables) as Markdown",
        description="Print every setting mlxd reads, with its type, default, flag, environment "
        "variable and help, as Markdown (the text of docs/configuration.md).",
    )


def run(args: argparse.Namespace) -> None:
    from ..config import markdown

    print(markdown(), end="")
