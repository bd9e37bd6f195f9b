"""An mlx-vlm model presented the way mlxd's engine calls an mlx-lm model.

`VisionModel(inputs, cache=..., input_embeddings=..., **extra)` runs mlx-vlm's language model as
mlx-vlm's generate_step does (`logits_to_keep=1`, the prompt's extra keyword arguments only on
calls that carry embeddings) and returns its logits. Per-row position state: Qwen-VL's language
model keeps mrope's `_rope_deltas` / `_position_ids` on itself between calls; here that state
is saved on the row's first cache entry after each call and put back before the next, so rows
that take turns on one model never read each other's.
"""

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .prompt import VisionPrompt

_ROW_STATE = ("_rope_deltas", "_position_ids")  # language-model attributes that are per row
_SLOT = "mlxd_row_state"  # the attribute on a row's cache[0] that holds them between calls


class VisionModel(nn.Module):
    """mlx-vlm's model (`vlm`) behind mlx-lm's calling convention, plus `embed`."""

    def __init__(self, vlm: nn.Module) -> None:
        super().__init__()
        self.vlm = vlm
        self.model_type = getattr(vlm.config, "model_type", "")

    @property
    def language_model(self) -> nn.Module:
        return self.vlm.language_model

    @property
    def config(self) -> Any:
        return self.vlm.config

    @property
    def layers(self) -> list[Any]:
        return self.language_model.layers

    def make_cache(self) -> list[Any]:
        """mlx-vlm's caches (its own KVCache classes), as its generate_step makes them."""
        from mlx_vlm.models.cache import make_prompt_cache

        return make_prompt_cache(self.language_model)

    def __call__(
        self,
        inputs: mx.array,
        cache: list[Any] | None = None,
        input_embeddings: mx.array | None = None,
        **extra: Any,
    ) -> mx.array:
        lm = self.language_model
        if _batched(cache) and hasattr(lm, "_rope_deltas"):
            return self._batched_text(lm, inputs, cache)
        kwargs = extra if input_embeddings is not None else {}  # decode steps: none, as mlx-vlm
        self._restore(lm, cache)
        out = lm(inputs, inputs_embeds=input_embeddings, cache=cache, logits_to_keep=1, **kwargs)
        self._save(lm, cache)
        return out.logits

    @staticmethod
    def _batched_text(lm: nn.Module, inputs: mx.array, cache: list[Any]) -> mx.array:
        """A batched step (every row text: rows with images run alone): mrope's positions are
        the rows' own offsets, each row's delta 0, given per row as mlx-vlm's batch does."""
        for name in _ROW_STATE:
            setattr(lm, name, None)  # no row's state applies to the batch
        deltas = mx.zeros((inputs.shape[0], 1), dtype=mx.int32)
        return lm(inputs, cache=cache, logits_to_keep=1, rope_deltas=deltas).logits

    @staticmethod
    def _restore(lm: nn.Module, cache: list[Any] | None) -> None:
        if not cache:
            return
        saved = getattr(cache[0], _SLOT, {})  # a fresh row starts from none (a fresh model)
        for name in _ROW_STATE:
            if hasattr(lm, name):
                setattr(lm, name, saved.get(name))

    @staticmethod
    def _save(lm: nn.Module, cache: list[Any] | None) -> None:
        if cache:
            state = {n: getattr(lm, n) for n in _ROW_STATE if hasattr(lm, n)}
            setattr(cache[0], _SLOT, state)

    def embed(self, prompt: VisionPrompt) -> mx.array:
        """The prompt's input embeddings (image features merged in), computed once; fills
        `prompt.embeddings` and adds what mlx-vlm's get_input_embeddings returns besides them
        (position ids, rope deltas) to `prompt.model_kwargs`."""
        if prompt.embeddings is not None:
            return prompt.embeddings
        extra = dict(prompt.extra)
        pixel_values, mask = extra.pop("pixel_values", None), extra.pop("attention_mask", None)
        # generate_step's order: caller metadata, then the embedding's, then explicit metadata.
        explicit = {
            k: extra[k] for k in ("position_ids", "rope_deltas") if extra.get(k) is not None
        }
        out = self.vlm.get_input_embeddings(
            prompt.input_ids[None], pixel_values, mask=mask, **extra
        )
        kwargs = dict(extra)
        kwargs.update(
            {k: v for k, v in out.to_dict().items() if k != "inputs_embeds" and v is not None}
        )
        kwargs.update(explicit)
        prompt.model_kwargs = kwargs
        prompt.embeddings = out.inputs_embeds[0]
        return prompt.embeddings


def _batched(cache: list[Any] | None) -> bool:
    """A batch's caches keep one offset per row (mlx-lm's BatchKVCache)."""
    offset = getattr(cache[0], "offset", None) if cache else None
    return isinstance(offset, mx.array) and offset.ndim > 0
