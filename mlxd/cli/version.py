"""`mlxd --version`: mlxd's version and the MLX stack's beside it, as vLLM prints its own (a
bug report needs all three; mlx-lm's own version decides what parity means)."""

import argparse
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

STACK = ("mlx", "mlx-lm")  # distribution names, read from installed metadata: nothing imported


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    stack = ", ".join(f"{dist} {_version(dist)}" for dist in STACK)
    return f"mlxd {_version('mlxd')} ({stack}, Python {platform.python_version()})"


class VersionAction(argparse.Action):
    """argparse's own version action wants the string up front; this reads it only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print mlxd's, mlx's and mlx-lm's versions and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        print(version_line(), file=sys.stdout)
        parser.exit()
