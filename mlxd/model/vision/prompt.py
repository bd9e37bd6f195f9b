"""A prompt with images, as mlx-vlm's processor prepares it for its model."""

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .media import MediaImage


@dataclass
class VisionPrompt:
    """What the engine needs for a row with images."""

    input_ids: mx.array  # 1-D prompt ids, image placeholders expanded
    embeddings: mx.array | None  # (L, hidden): filled by VisionModel.embed
    extra: dict[str, Any]  # the processor's other outputs (pixel_values, image_grid_thw, mask)
    digests: tuple[str, ...]  # per image, in order
    # The language model's keyword arguments for the prompt's calls (set by VisionModel.embed).
    model_kwargs: dict[str, Any] = field(default_factory=dict)


def _pil(image: Any) -> Any:
    """A PIL image of a MediaImage / H x W x 3 array; paths and PIL images pass unchanged (mlx-vlm
    loads them)."""
    from PIL import Image

    if isinstance(image, MediaImage):
        image = image.pixels
    if isinstance(image, np.ndarray):
        return Image.fromarray(image)
    return image


def vision_prompt(processor: Any, text: str, images: list[MediaImage] | list[Any]) -> VisionPrompt:
    """mlx-vlm's prepare_inputs for `text` (already templated) and `images`, with the arguments
    its generate passes (the model type the loader recorded on the processor)."""
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    model_type = getattr(processor, "mlxd_model_type", "")
    image_token = getattr(processor, "mlxd_image_token_index", None)
    pil = [_pil(im) for im in images]
    inputs = prepare_inputs(
        processor,
        images=pil or None,
        prompts=text,
        image_token_index=image_token,
        add_special_tokens=should_add_special_tokens(model_type, processor),
    )
    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k != "input_ids"}
    extra["pixel_values"] = inputs.get("pixel_values")
    digests = tuple(im.digest for im in images if isinstance(im, MediaImage))
    return VisionPrompt(input_ids=ids[0], embeddings=None, extra=extra, digests=digests)
