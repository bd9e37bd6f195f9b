"""Evaluate a caller's lazy arrays before they cross to the engine thread."""

from typing import Any

import mlx.core as mx
import mlx.nn as nn


def materialize(*trees: Any) -> None:
    """Evaluate every array reachable from modules/caches in the calling thread.

    MLX streams are per thread: a lazy array built in the caller (e.g. a rope module's private
    `_freqs`) cannot be evaluated on the engine thread, so it is computed here first.
    """
    arrays: list[mx.array] = []
    seen: set[int] = set()

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, mx.array):
            arrays.append(x)
        elif isinstance(x, dict | list | tuple):
            for v in x.values() if isinstance(x, dict) else x:
                visit(v)
        elif hasattr(x, "__dict__") and not callable(x) or isinstance(x, nn.Module):
            for v in vars(x).values():
                visit(v)
            if isinstance(x, nn.Module):
                for v in x.values():
                    visit(v)

    for tree in trees:
        visit(tree)
    mx.eval(arrays)
