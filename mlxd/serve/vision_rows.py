"""A chat row whose prompt holds images, on a vision model: the processor expands each image's
placeholder into its patch tokens, the vision tower turns the pixels into the prompt's
embeddings (here, in the request's thread, before the row is queued), and the row carries
them with the language model's prompt arguments (mrope's positions for Qwen-VL). A seeded
sampled row draws as mlx-vlm's generate does (its positioned keys)."""

from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from ..model.vision.prompt import VisionPrompt, vision_prompt
from ..model.vision.sampling import vision_sampler
from .errors import bad_request
from .prompt import Prompt


@dataclass
class VisionRow:
    embeddings: mx.array
    model_kwargs: dict[str, Any]
    digests: tuple[str, ...]


def expand(served: Any, prompt: Prompt) -> tuple[Prompt, VisionRow | None]:
    """The prompt with its images' tokens in place and the row's vision inputs; a text prompt
    passes unchanged (None)."""
    if not prompt.images:
        return prompt, None
    model = served.model
    try:
        vp: VisionPrompt = vision_prompt(model.processor, prompt.text, list(prompt.images))
    except Exception as e:  # noqa: BLE001 - a processor refusing the images is the request's
        raise bad_request(f"the model's processor refused the images: {e}", "messages") from e
    model.embed(vp)
    arrays = [v for v in vp.model_kwargs.values() if isinstance(v, mx.array)]
    mx.eval(vp.input_ids, vp.embeddings, arrays)  # the engine runs on its own stream
    tokens = vp.input_ids.tolist()
    row = VisionRow(vp.embeddings, vp.model_kwargs, vp.digests)
    return replace(prompt, tokens=tokens, cuts=()), row


def sampler_for(served: Any, p: Any) -> Any:
    """mlx-vlm's sampler where its draws differ from mlx-lm's (a seed at temperature > 0)."""
    if p.seed is None or p.temperature <= 0:
        return None
    return vision_sampler(served.model.config, p.temperature, p.top_p, p.top_k, p.min_p, p.seed)
