"""Where `mlxd bench generate` takes `mlxd serve`'s step size and attention flags from, until it
imports them from cli/serve.py."""

from .serve import add_step_size_and_attention

__all__ = ["add_step_size_and_attention"]
