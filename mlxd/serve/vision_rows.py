"""A chat row whose prompt holds images, on a vision model: the processor expands each image's
placeholder into its patch tokens, the vision tower turns the pixels into features (in one
call with the other requests' images waiting beside them, vision_batch.py), the request's
thread merges its own into the prompt's embeddings before the row is queued, and the row
carries them with the language model's prompt arguments (mrope's positions for Qwen-VL). A
seeded sampled row draws as mlx-vlm's generate does (its positioned keys).

The prefix store keys such a row by `media_key`: the prompt with each image's patch tokens
replaced by negative ids from the digest of its decoded pixels, so a turn that sends the same
picture again (as any encoding) reuses the cache past it, and another picture never does."""

import threading
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from ..config import EngineConfig
from ..model.vision.prompt import VisionPrompt, vision_prompt
from ..model.vision.sampling import vision_sampler
from .errors import bad_request
from .prompt import Prompt
from .vision_batch import VisionBatcher

_BATCHER = threading.Lock()  # one batcher per served model, made on its first image request


@dataclass
class VisionRow:
    embeddings: mx.array
    model_kwargs: dict[str, Any]
    digests: tuple[str, ...]
    cache_key: list[int] | None  # the prefix store's key (media_key), None: no store


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
    batcher(served).embed(vp)
    arrays = [v for v in vp.model_kwargs.values() if isinstance(v, mx.array)]
    mx.eval(vp.input_ids, vp.embeddings, arrays)  # the engine runs on its own stream
    tokens = vp.input_ids.tolist()
    kwargs = dict(vp.model_kwargs)
    key = media_key(tokens, image_token(model.config), vp.digests)
    row = VisionRow(vp.embeddings, kwargs, vp.digests, key)
    return replace(prompt, tokens=tokens, cuts=()), row


def batcher(served: Any) -> VisionBatcher:
    """The served model's vision batcher, its budget the engine's `vision_batch_pixels`."""
    model = served.model
    with _BATCHER:
        if (b := getattr(model, "vision_batcher", None)) is None:
            config = getattr(served.engine, "config", None) or EngineConfig()
            b = model.vision_batcher = VisionBatcher(model, config.vision_batch_pixels)
    return b


def sampler_for(served: Any, p: Any) -> Any:
    """mlx-vlm's sampler where its draws differ from mlx-lm's (a seed at temperature > 0)."""
    if p.seed is None or p.temperature <= 0:
        return None
    return vision_sampler(served.model.config, p.temperature, p.top_p, p.top_k, p.min_p, p.seed)


def image_token(config: Any) -> int | None:
    """The id the processor repeats for each patch of an image (Qwen-VL's <|image_pad|>,
    Gemma 3's <image_soft_token>), as mlx-vlm's models name it."""
    for name in ("image_token_id", "image_token_index"):
        if isinstance(tok := getattr(config, name, None), int):
            return tok
    return None


def media_id(digest: str, j: int) -> int:
    """The key id of an image's j-th patch token: one of the digest's eight 31-bit words, turn
    about, made negative (no vocabulary id is; int32, as the store keeps keys). A run of 8
    patches or more keys on 248 bits of the digest."""
    word = int(digest[8 * (j % 8) : 8 * (j % 8) + 8], 16) >> 1
    return -1 - word


def media_key(tokens: list[int], token: int | None, digests: tuple[str, ...]) -> list[int] | None:
    """`tokens` with the i-th run of `token` keyed by the i-th digest; None (no store for the
    row) when the runs and the images do not pair up one to one."""
    if token is None:
        return None
    key, runs, j = list(tokens), -1, 0
    for i, t in enumerate(tokens):
        if t != token:
            continue
        if i == 0 or tokens[i - 1] != token:
            runs, j = runs + 1, 0
            if runs >= len(digests):
                return None
        key[i] = media_id(digests[runs], j)
        j += 1
    return key if runs + 1 == len(digests) else None
