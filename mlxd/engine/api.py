"""The Python generation API with mlx-lm's signatures and results (one engine per model).

`stream_generate` / `generate` run on mlxd's Engine (one per model, its own thread), with a
draft model too (mlx-lm's speculative_generate_step, engine/draft_row.py); `batch_generate` on
an engine of its own.
The parity tests (tests/parity) hold all of them bit-exact to mlx-lm.
"""

import threading
import time
import weakref
from collections.abc import Generator, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchResponse, GenerationResponse
from mlx_lm.generate_utils import BatchStats
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..config import EngineConfig
from .engine import Engine
from .request import GenerationRequest, RequestHandle, Speculation, TokenEvent
from .rng import current_key, set_key


def _encode(tokenizer: TokenizerWrapper, prompt: str | mx.array | list[int]) -> mx.array:
    """mlx-lm's rule: string prompts get special tokens unless they already start with BOS."""
    if isinstance(prompt, mx.array):
        return prompt
    if isinstance(prompt, str):
        bos = tokenizer.bos_token
        prompt = tokenizer.encode(
            prompt, add_special_tokens=bos is None or not prompt.startswith(bos)
        )
    return mx.array(prompt)


def stream_generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper | Any,
    prompt: str | mx.array | list[int],
    max_tokens: int = 256,
    draft_model: nn.Module | None = None,
    **kwargs: Any,
) -> Generator[GenerationResponse, None, None]:
    """Yield a GenerationResponse per token; the last one carries finish_reason. With a
    `draft_model`, mlx-lm's speculative decoding (`num_draft_tokens`, default 2)."""
    if max_tokens == 0:
        raise ValueError("Maximum number of tokens must be non-zero (use -1 for no limit).")
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    prompt = _encode(tokenizer, prompt)
    num_draft_tokens = kwargs.pop("num_draft_tokens", 2)
    kwargs.pop("stream", None)  # the engine thread owns its stream
    if draft_model is not None:  # what mlx-lm's stream_generate drops or refuses for drafting
        kwargs.pop("max_kv_size", None)
        kwargs.pop("prompt_progress_callback", None)
        if kwargs.pop("input_embeddings", None) is not None:
            raise ValueError("Speculative decoding does not support input embeddings.")
        kwargs.setdefault("prefill_step_size", 512)  # speculative_generate_step's default
        kwargs["speculation"] = Speculation(mode="draft", max_draft=num_draft_tokens)
    eos = frozenset(tokenizer.eos_token_ids)
    req = GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        stop_token_ids=eos,
        random_key=current_key(),
        tokenizer=tokenizer,  # detokenized by the turn that makes each token, as mlx-lm does
        **kwargs,
    )
    engine = engine_for(model)
    engine.use_draft(draft_model)  # this call's draft (or none): rows started from here on
    handle = engine.submit_driven(req)  # alone on the main thread: its turns run here (driver.py)
    events = engine.drive(handle)
    finished = False
    try:
        yield from _responses(handle, events, prompt.size, max_tokens, eos)
        finished = True
    finally:
        handle.cancel()  # a consumer that stops early frees the row
        if not finished:
            events.close()  # the engine thread ends the row
    for _ in events:  # the row's last turn (it ends there, cancelled or not)
        pass
    if (key := handle.done.random_key if handle.done else None) is not None:
        set_key(key)  # the caller's PRNG advances as it would have under mlx-lm


def _responses(
    handle: RequestHandle,
    events: Iterator[TokenEvent],
    n_prompt: int,
    max_tokens: int,
    eos: frozenset[int],
) -> Generator[GenerationResponse, None, None]:
    """mlx-lm's stream_generate loop over the engine's events (same fields, same order). Each
    event's text is the detokenizer's segment for it; the finishing token's holds the final
    flush, as mlx-lm yields it after `finalize()`."""
    token, logprobs, text, n, drafted = None, None, "", 0, False
    tic = time.perf_counter()
    for n, event in enumerate(events):
        token, logprobs, drafted = event.token, event.logprobs, event.from_draft
        if n == 0:
            prompt_time = time.perf_counter() - tic
            prompt_tps = n_prompt / prompt_time
            tic = time.perf_counter()
        if token in eos or (n + 1) == max_tokens:
            text = event.text
            break
        yield _response(event.text, token, logprobs, drafted, n, n_prompt, prompt_tps, tic)
    else:  # the row ended without a finishing token: its last flush is on the DoneEvent
        text = handle.done.text if handle.done is not None else ""
    if token is None:  # the engine closed before the first token
        return
    yield _response(
        text,
        token,
        logprobs,
        drafted,
        n,
        n_prompt,
        prompt_tps,
        tic,
        "stop" if token in eos else "length",
    )


def _response(
    text: str,
    token: int,
    logprobs: mx.array,
    from_draft: bool,
    n: int,
    n_prompt: int,
    prompt_tps: float,
    tic: float,
    finish_reason: str | None = None,
) -> GenerationResponse:
    return GenerationResponse(
        text=text,
        token=token,
        logprobs=logprobs,
        from_draft=from_draft,
        prompt_tokens=n_prompt,
        prompt_tps=prompt_tps,
        generation_tokens=n + 1,
        generation_tps=(n + 1) / (time.perf_counter() - tic),
        peak_memory=mx.get_peak_memory() / 1e9,
        finish_reason=finish_reason,
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
    """Generate for several token prompts at once (mlx-lm's BatchResponse), on an engine of
    its own whose batched step is configured as mlx-lm's BatchGenerator would be."""
    cbs, pbs = kwargs.pop("completion_batch_size", 32), kwargs.pop("prefill_batch_size", 8)
    config = EngineConfig(
        batch=max(len(prompts), 1),
        completion_batch_size=max(cbs, pbs),
        prefill_batch_size=pbs,
        prefill_step_size=kwargs.pop("prefill_step_size", 2048),
        max_kv_size=kwargs.pop("max_kv_size", None),
    )
    sampler, processors = kwargs.pop("sampler", None), kwargs.pop("logits_processors", None)
    kwargs.pop("stream", None)
    if kwargs:
        raise TypeError(f"batch_generate() got unexpected keyword arguments {sorted(kwargs)}")
    n = len(prompts)
    limits = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
    eos = frozenset(tokenizer.eos_token_ids)
    key = current_key()  # the batch samples from the caller's PRNG key, as mlx-lm's does
    reqs = [
        GenerationRequest(
            prompt=mx.array(p),
            random_key=key,
            max_tokens=m,
            sampler=sampler,
            logits_processors=processors,
            prompt_cache=c,
            max_kv_size=config.max_kv_size,
            stop_token_ids=eos,
            prefill_step_size=config.prefill_step_size,
            return_prompt_cache=return_prompt_caches,
        )
        for p, m, c in zip(prompts, limits, prompt_caches or [None] * n, strict=True)
    ]
    # Every prompt is admitted at once (the batched step queues beyond its own cap, as
    # BatchGenerator does) and no row takes the serial path: BatchGenerator's bits throughout.
    engine = Engine(model, config, serial_fast_path=False)
    try:
        if verbose:
            print(f"[batch_generate] Finished processing 0/{n} ...", end="\r")
        handles = engine.submit_many(reqs)
        tokens, logprobs, caches = [], [], []
        for fin, handle in enumerate(handles, 1):
            events = list(handle)
            if handle.done.reason == "stop":
                events = events[:-1]  # mlx-lm drops the stop token
            tokens.append([e.token for e in events])
            if return_logprobs:  # an MLX op and a sync a token: only when asked, as mlx-lm
                logprobs.append([e.logprobs[e.token].item() for e in events])
            caches.append(handle.done.prompt_cache)
            if verbose:
                print(f"[batch_generate] Finished processing {fin}/{n} ...", end="\r")
        stats = engine.last_batch_stats or BatchStats()
        if sampler is not None and engine.last_batch_key is not None:
            set_key(engine.last_batch_key)  # only a given sampler draws from the caller's key
    finally:
        engine.close()
    if verbose:
        print(f"[batch_generate] Finished processing {n}/{n}")
        print(
            f"[batch_generate] Prompt: {stats.prompt_tokens} tokens, "
            f"{stats.prompt_tps:.3f} tokens-per-sec"
        )
        print(
            f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
            f"{stats.generation_tps:.3f} tokens-per-sec"
        )
        print(f"[batch_generate] Peak memory: {stats.peak_memory:.3f} GB")
    return BatchResponse(
        [tokenizer.decode(t) for t in tokens],
        stats,
        caches if return_prompt_caches else None,
        tokens if return_token_ids else None,
        logprobs if return_logprobs else None,
    )


# One Engine per model for the Python API, closed when the model is garbage-collected.

_engines: dict[int, Engine] = {}
_lock = threading.Lock()


def engine_for(model: Any) -> Engine:
    """The API's engine for `model` (created on first use)."""
    key = id(model)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = Engine(model, weak_model=True)
            weakref.finalize(model, _drop, key)
        return engine


def _drop(key: int) -> None:
    with _lock:
        engine = _engines.pop(key, None)
    if engine is not None:
        engine.close()
