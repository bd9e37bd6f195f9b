"""An mlx-vlm model presented the way mlxd's engine calls an mlx-lm model.

`VisionModel(inputs, cache=..., input_embeddings=..., **extra)` runs mlx-vlm's language model as
mlx-vlm's generate_step does (`logits_to_keep=1`, the prompt's extra keyword arguments only on
calls that carry embeddings) and returns its logits. Per-row position state: Qwen-VL's language
model keeps mrope's `_rope_deltas` / `_position_ids` on itself between calls; here that state
is saved on the row's first cache entry after each call and put back before the next, so rows
that take turns on one model never read each other's. A batched call (a batch's caches keep
one offset per row) takes its rows' states in row order from `rows(...)`, set by the engine's
batch around each call: mrope's positions are each row's offset plus its own delta (0 for a
text row), given as `rope_deltas` of shape (B, 1) as mlx-vlm's own batch does.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .prompt import VisionPrompt

_ROW_STATE = ("_rope_deltas", "_position_ids")  # language-model attributes that are per row
_SLOT = "mlxd_row_state"  # the attribute on a row's cache[0] that holds them between calls
RowState = dict[str, Any] | None  # a row's saved state (None: a text row that never ran alone)


class _Rows:
    """The rows of the batched call being built (a plain holder: an nn.Module attribute that is
    a list would count as one of its parameters)."""

    states: Sequence[RowState] | None = None


class VisionModel(nn.Module):
    """mlx-vlm's model (`vlm`) behind mlx-lm's calling convention, plus `embed`."""

    def __init__(self, vlm: nn.Module) -> None:
        super().__init__()
        self.vlm = vlm
        self.model_type = getattr(vlm.config, "model_type", "")
        self._rows = _Rows()

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
            return self._batched_call(lm, inputs, cache)
        kwargs = extra if input_embeddings is not None else {}  # decode steps: none, as mlx-vlm
        self._restore(lm, cache)
        out = lm(inputs, inputs_embeds=input_embeddings, cache=cache, logits_to_keep=1, **kwargs)
        self._save(lm, cache)
        return out.logits

    @contextmanager
    def rows(self, states: Sequence[RowState]) -> Iterator[None]:
        """The batched calls inside get these rows' states, in the batch's row order."""
        before, self._rows.states = self._rows.states, states
        try:
            yield
        finally:
            self._rows.states = before

    def _batched_call(self, lm: nn.Module, inputs: mx.array, cache: list[Any]) -> mx.array:
        """A batched step (rows with images prefilled alone, so only token ids come here):
        mrope's positions are the rows' own offsets plus each row's delta, given per row as
        mlx-vlm's batch does."""
        for name in _ROW_STATE:
            setattr(lm, name, None)  # no one row's state applies to the batch
        deltas = _deltas(self._rows.states, inputs.shape[0])
        return lm(inputs, cache=cache, logits_to_keep=1, rope_deltas=deltas).logits

    @staticmethod
    def row_state(cache: list[Any]) -> RowState:
        """A row's state saved on its caches after its last call alone (None: none saved)."""
        return getattr(cache[0], _SLOT, None) if cache else None

    def resume(self, cache: list[Any], state: RowState) -> None:
        """A row leaving a batch for serial caches goes on from its state: its own, or a text
        row's when it had none (`_text_state`)."""
        if cache and hasattr(self.language_model, "_rope_deltas"):
            setattr(cache[0], _SLOT, state if state is not None else _text_state())

    @staticmethod
    def _restore(lm: nn.Module, cache: list[Any] | None) -> None:
        if not cache:
            return
        saved = getattr(cache[0], _SLOT, None)
        if saved is None:  # a fresh row starts from none (a fresh model); a cache that holds
            # tokens but no state (the prefix store's) is a text prefix: a delta of 0
            saved = _text_state() if _offset(cache[0]) > 0 else {}
        for name in _ROW_STATE:
            if hasattr(lm, name):
                setattr(lm, name, saved.get(name))

    @staticmethod
    def _save(lm: nn.Module, cache: list[Any] | None) -> None:
        if cache:
            state = {n: getattr(lm, n) for n in _ROW_STATE if hasattr(lm, n)}
            setattr(cache[0], _SLOT, state)

    def embed(self, prompt: VisionPrompt, features: mx.array | None = None) -> mx.array:
        """The prompt's input embeddings (image features merged in), computed once; fills
        `prompt.embeddings` and adds what mlx-vlm's get_input_embeddings returns besides them
        (position ids, rope deltas) to `prompt.model_kwargs`. `features`: its images' features
        as `image_features` made them (merged as mlx-vlm merges its cached features)."""
        if prompt.embeddings is not None:
            return prompt.embeddings
        extra = dict(prompt.extra)
        pixel_values, mask = extra.pop("pixel_values", None), extra.pop("attention_mask", None)
        # generate_step's order: caller metadata, then the embedding's, then explicit metadata.
        explicit = {
            k: extra[k] for k in ("position_ids", "rope_deltas") if extra.get(k) is not None
        }
        cached = {} if features is None else {"cached_image_features": features}
        out = self.vlm.get_input_embeddings(
            prompt.input_ids[None], pixel_values, mask=mask, **extra, **cached
        )
        kwargs = dict(extra)
        kwargs.update(
            {k: v for k, v in out.to_dict().items() if k != "inputs_embeds" and v is not None}
        )
        kwargs.update(explicit)
        prompt.model_kwargs = kwargs
        prompt.embeddings = out.inputs_embeds[0]
        return prompt.embeddings

    def tower_key(self, prompt: VisionPrompt) -> tuple[Any, ...] | None:
        """What prompts whose images go through the tower in one call share (None: this one's
        run alone, in `embed`): Qwen2.5-VL's patches of any size (per-image attention over
        their concatenation); Gemma 3's images of one size, stacked. Both are bit-exact
        batched (tests/serve/test_vision_encoder_batch.py); other towers are not batched."""
        pixels = prompt.extra.get("pixel_values")
        if pixels is None or any(k.endswith("_videos") for k in prompt.extra):
            return None
        if self.model_type == "qwen2_5_vl" and prompt.extra.get("image_grid_thw") is not None:
            return ("patches", pixels.shape[1:])
        if self.model_type == "gemma3" and pixels.ndim == 4:
            return ("stacked", pixels.shape[1:])
        return None

    def image_pixels(self, prompt: VisionPrompt) -> int:
        """Pixels the tower reads for the prompt's images, as its processor sized them."""
        pixels = prompt.extra["pixel_values"]
        if self.model_type == "qwen2_5_vl":
            grid, patch = prompt.extra["image_grid_thw"], self.config.vision_config.patch_size
            return int((grid[:, 1] * grid[:, 2]).sum().item()) * patch * patch
        return int(pixels.shape[0] * pixels.shape[-2] * pixels.shape[-1])

    def image_features(self, prompts: Sequence[VisionPrompt]) -> list[mx.array]:
        """The tower and projector over every prompt's images in one call (prompts of one
        `tower_key`), split back per prompt: what get_input_embeddings computes for each."""
        vlm, pixels = self.vlm, [p.extra["pixel_values"] for p in prompts]
        if self.model_type == "qwen2_5_vl":
            dtype = vlm.vision_tower.patch_embed.proj.weight.dtype
            grids = [p.extra["image_grid_thw"] for p in prompts]
            out = vlm.vision_tower(
                mx.concatenate(pixels).astype(dtype), mx.concatenate(grids),
                output_hidden_states=False,
            )  # fmt: skip
            merge = self.config.vision_config.spatial_merge_size**2
            sizes = [int(g.prod(axis=1).sum().item()) // merge for g in grids]
        else:  # Gemma 3: (N, 3, H, W) stacked, channels last, the text model's dtype
            dtype = vlm.language_model.model.embed_tokens(mx.array([0])).dtype  # quantized too
            stacked = mx.concatenate(pixels).transpose(0, 2, 3, 1).astype(dtype)
            hidden, _, _ = vlm.vision_tower(stacked, output_hidden_states=True)
            out, sizes = vlm.multi_modal_projector(hidden), [p.shape[0] for p in pixels]
        cuts = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
        return mx.split(out, cuts) if cuts else [out]


def _text_state() -> dict[str, Any]:
    """A text row's mrope state: delta 0, and 3-D positions (mlx-vlm's prefill of text leaves
    them 3-D; only their rank is read once the cache holds tokens)."""
    zero = mx.zeros((1, 1), dtype=mx.int32)
    return {"_rope_deltas": zero, "_position_ids": mx.zeros((3, 1, 1), dtype=mx.int32)}


def _offset(layer: Any) -> int:
    offset = getattr(layer, "offset", 0)
    return int(offset) if not isinstance(offset, mx.array) else int(offset.max().item())


def _deltas(states: Sequence[RowState] | None, rows: int) -> mx.array:
    """Each row's mrope delta, (B, 1) in row order: a text row's is 0."""
    if states is None or len(states) != rows:
        return mx.zeros((rows, 1), dtype=mx.int32)  # a batch of text rows only
    deltas = [(s or {}).get("_rope_deltas") for s in states]
    if all(d is None for d in deltas):
        return mx.zeros((rows, 1), dtype=mx.int32)
    return mx.concatenate(
        [mx.zeros((1, 1), mx.int32) if d is None else d.reshape(1, 1).astype(mx.int32)
         for d in deltas]
    )  # fmt: skip


def _batched(cache: list[Any] | None) -> bool:
    """A batch's caches keep one offset per row (mlx-lm's BatchKVCache)."""
    offset = getattr(cache[0], "offset", None) if cache else None
    return isinstance(offset, mx.array) and offset.ndim > 0
