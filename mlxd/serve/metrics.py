"""Prometheus metrics (placeholder until the metrics work lands: no routes, no series)."""

from typing import Any


def make_metrics(state: Any) -> None:
    return None


def add_routes(app: Any, state: Any) -> None:
    return None
