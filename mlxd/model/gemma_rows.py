"""Gemma 3's decoder block and MLP over 2-D rows, for plain_rows.py's one-token step: mlx-lm's
gemma3_text formula (four norms, clipped residuals, a gelu-gated MLP) on (B, D) rows, the same
ops in the same order, so the same bits (tests/model/test_plain_rows.py)."""

import functools
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .rows_step import HeldMLP


class GemmaMLP(HeldMLP):
    """gemma3_text's MLP, down(gelu_approx(gate(x)) * up(x)), over held transposes."""

    def rows(self, x: mx.array) -> mx.array:
        return self._down(nn.gelu_approx(self._gate(x)) * self._up(x))


class GemmaRowsStep:
    """Mixed into a copy of a gemma3_text block (rows_step.rows_block): a one-token step runs
    its formula over (B, D); anything else goes to the block's own call."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        attn = self.self_attn  # type: ignore[attr-defined]
        if not attn.takes_rows(x, mask, cache):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        clip = _clip_residual()
        B, _, D = x.shape
        x = x.reshape(B, D)
        r = attn.rows(self.input_layernorm(x), mask, cache)  # type: ignore[attr-defined]
        h = clip(x, self.post_attention_layernorm(r))  # type: ignore[attr-defined]
        r = self.mlp.rows(self.pre_feedforward_layernorm(h))  # type: ignore[attr-defined]
        return clip(h, self.post_feedforward_layernorm(r)).reshape(B, 1, D)  # type: ignore[attr-defined]


@functools.cache  # read per layer per step: the import once
def _clip_residual() -> Any:
    from mlx_lm.models.gemma3_text import clip_residual

    return clip_residual


@functools.cache
def gemma_blocks() -> tuple[type, ...]:
    """The blocks whose call is GemmaRowsStep's formula (read in mlx-lm 0.32)."""
    from mlx_lm.models import gemma3_text

    return (gemma3_text.TransformerBlock,)


@functools.cache
def gemma_mlps() -> tuple[type, ...]:
    from mlx_lm.models import gemma3_text

    return (gemma3_text.MLP,)
