"""The `mlxd serve` subparser, built the way `mlxd` builds it."""

import argparse

from mlxd.cli import build_parser


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices["serve"]
