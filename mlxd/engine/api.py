"""The Python generation API with mlx-lm's signatures and results.

For now these run mlx-lm's own serial and batch loops; the engine issue moves them onto
mlxd's engine, and the parity tests (tests/parity) keep them bit-exact through that move.
"""

from collections.abc import Generator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchResponse, GenerationResponse
from mlx_lm.generate import batch_generate as _mlx_batch_generate
from mlx_lm.generate import stream_generate as _mlx_stream_generate
from mlx_lm.tokenizer_utils import TokenizerWrapper


def stream_generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper | Any,
    prompt: str | mx.array | list[int],
    max_tokens: int = 256,
    draft_model: nn.Module | None = None,
    **kwargs: Any,
) -> Generator[GenerationResponse, None, None]:
    """Yield a GenerationResponse per token; the last one carries finish_reason."""
    yield from _mlx_stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, draft_model=draft_model, **kwargs
    )


def generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper | Any,
    prompt: str | list[int],
    verbose: bool = False,
    **kwargs: Any,
) -> str:
    """The whole completion as text; `verbose` prints mlx-lm's exact report format."""
    if verbose:
        print("=" * 10)
    text = ""
    response = None
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose:
        print()
        print("=" * 10)
        if len(text) == 0 or response is None:
            print("No text generated for this prompt")
            return None  # mlx-lm returns None here too
        print(f"Prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec")
        print(
            f"Generation: {response.generation_tokens} tokens, "
            f"{response.generation_tps:.3f} tokens-per-sec"
        )
        print(f"Peak memory: {response.peak_memory:.3f} GB")
    return text


def batch_generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper | Any,
    prompts: list[list[int]],
    prompt_caches: list[list[Any]] | None = None,
    max_tokens: int | list[int] = 128,
    verbose: bool = False,
    return_prompt_caches: bool = False,
    return_token_ids: bool = False,
    return_logprobs: bool = False,
    **kwargs: Any,
) -> BatchResponse:
    """Generate for several token prompts at once (mlx-lm's BatchResponse)."""
    return _mlx_batch_generate(
        model,
        tokenizer,
        prompts,
        prompt_caches=prompt_caches,
        max_tokens=max_tokens,
        verbose=verbose,
        return_prompt_caches=return_prompt_caches,
        return_token_ids=return_token_ids,
        return_logprobs=return_logprobs,
        **kwargs,
    )
