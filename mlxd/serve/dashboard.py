"""The live dashboard at `/dashboard`: what the engines are doing, from a JSON endpoint."""

from fastapi import FastAPI


def add_routes(app: FastAPI) -> None:
    """Placeholder until the dashboard lands: no routes."""
