"""The chat page at `/` and its static files under `/ui/` (package data, vendored, offline)."""

from fastapi import FastAPI


def add_routes(app: FastAPI) -> None:
    """Placeholder until the page lands: no routes."""
