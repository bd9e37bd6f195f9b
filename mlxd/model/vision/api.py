"""`generate` / `stream_generate` with images: mlx-vlm's arguments (`image=`: paths, arrays,
PIL images or MediaImages) run on mlxd's engine, whose stream function the caller passes in
(this layer sits below the engine)."""

from collections.abc import Callable, Generator
from typing import Any

import mlx.core as mx

from .model import VisionModel
from .prompt import VisionPrompt, vision_prompt
from .sampling import vision_sampler

# generate_step's sampling arguments, taken here to build its sampler.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed")


def tokenizer_of(processor: Any) -> Any:
    """mlx-lm's TokenizerWrapper over the processor's tokenizer, stopping where mlx-vlm's
    stopping criteria stop (the model config's eos ids)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    tok = getattr(processor, "tokenizer", processor)
    criteria = getattr(tok, "stopping_criteria", None)
    eos = list(criteria.eos_token_ids) if criteria is not None else None
    return TokenizerWrapper(tok, eos_token_ids=eos)


def prepared(model: VisionModel, processor: Any, prompt: str, image: Any) -> VisionPrompt:
    """The prompt's ids and embeddings, evaluated here (the engine runs on its own stream)."""
    images = image if isinstance(image, list | tuple) else ([] if image is None else [image])
    vp = vision_prompt(processor, prompt, list(images))
    model.embed(vp)
    mx.eval(vp.input_ids, vp.embeddings, [v for v in vp.model_kwargs.values()
                                          if isinstance(v, mx.array)])  # fmt: skip
    return vp


def stream_vision(
    stream: Callable[..., Generator[Any, None, None]],
    model: VisionModel,
    processor: Any,
    prompt: str,
    image: Any = None,
    max_tokens: int = 256,
    **kwargs: Any,
) -> Generator[Any, None, None]:
    """mlx-vlm's stream_generate on mlxd's serial row: its sampler (positioned keys for a
    seed), its stop ids, the prompt's embeddings and language-model keyword arguments."""
    vp = prepared(model, processor, prompt, image)
    sampling = {k: kwargs.pop(k) for k in _SAMPLING if k in kwargs}
    if "temp" in kwargs:
        sampling["temperature"] = kwargs.pop("temp")
    if kwargs.get("sampler") is None:
        kwargs["sampler"] = vision_sampler(model.config, **sampling)
    yield from stream(
        model,
        tokenizer_of(processor),
        vp.input_ids,
        max_tokens=max_tokens,
        input_embeddings=vp.embeddings,
        model_kwargs=vp.model_kwargs,
        **kwargs,
    )
