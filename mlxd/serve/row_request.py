"""A server request's GenerationRequest: mlx_lm.server's sampler, processors, stop sequences and
limits from the parsed parameters, with every bad value a 400 before any prefill."""

from typing import Any

import mlx.core as mx

from ..config import ServeConfig
from ..engine import GenerationRequest, SamplingParams
from .errors import bad_request
from .params import GenParams
from .prompt import Prompt
from .provider import Served
from .speculation import row_speculation
from .vision_rows import expand, sampler_for


def constrained(served: Served, p: GenParams) -> Any:
    """The row's grammar as a logits processor (compiled and cached per schema and tokenizer),
    or None. A grammar that does not compile is a 400 before any prefill."""
    if p.constraint is None:
        return None
    from ..constrain import ConstraintError, compiler_for
    from ..constrain.processor import GrammarLogitsProcessor

    try:
        return GrammarLogitsProcessor(compiler_for(served.tokenizer).matcher(p.constraint))
    except ConstraintError as e:
        raise bad_request(str(e), e.param) from e


def build_request(
    served: Served, prompt: Prompt, p: GenParams, config: ServeConfig, kv_config: Any = None
) -> GenerationRequest:
    """`kv_config`: the loaded --kv-config (a kv.mixed.MixedKV), or None."""
    tok = served.tokenizer
    prompt, vision = expand(served, prompt)
    n_prompt = len(prompt.tokens)
    if n_prompt == 0:
        raise bad_request("the prompt is empty", "prompt")
    if p.n > served.engine.batch:
        raise bad_request(f"n must be at most {served.engine.batch} (the server's --batch)", "n")
    grammar = constrained(served, p)
    max_tokens = p.max_tokens
    if (ctx := served.context_length) is not None:
        if n_prompt >= ctx:
            raise bad_request(
                f"the prompt is {n_prompt} tokens but the model's context length is {ctx}",
                "messages",
            )
        max_tokens = min(max_tokens, ctx - n_prompt)  # what fits; the rest could never run
    vocab = served.facts.vocab
    if vocab is not None and p.logit_bias and any(not 0 <= t < vocab for t in p.logit_bias):
        raise bad_request(f"logit_bias token ids must be in [0, {vocab})", "logit_bias")
    if vocab is not None and (bad := [t for t in prompt.tokens if not 0 <= t < vocab]):
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
    eos = list(tok.eos_token_ids)
    sampling = SamplingParams(
        temp=p.temperature,
        top_p=p.top_p,
        min_p=p.min_p,
        top_k=0 if vocab is not None and p.top_k >= vocab else p.top_k,  # keeps every token
        xtc_probability=p.xtc_probability,
        xtc_threshold=p.xtc_threshold,
        xtc_special_tokens=tok.encode("\n") + eos,
        logit_bias=p.logit_bias,
        repetition_penalty=p.repetition_penalty,
        repetition_context_size=p.repetition_context_size,
        presence_penalty=p.presence_penalty,
        presence_context_size=p.presence_context_size,
        frequency_penalty=p.frequency_penalty,
        frequency_context_size=p.frequency_context_size,
    )
    return GenerationRequest(
        prompt=mx.array(prompt.tokens),
        max_tokens=max_tokens,
        prefill_step_size=config.prefill_step_size,
        kv_bits=config.kv_bits,
        kv_group_size=config.kv_group_size,
        quantized_kv_start=config.quantize_from,
        kv_config=kv_config,
        # Where mlx_lm.server fails mid-request ("RotatingKVCache Quantization NYI"), mlxd
        # quantizes sliding-window layers too (kv/rotating_quantized.py, mlx-optiq's bits).
        quantize_windows=True,
        stop_token_ids=frozenset(eos),
        stop_sequences=[tok.encode(w, add_special_tokens=False) for w in p.stop],
        sampling=sampling,
        # The grammar masks last, after mlx-lm's bias and penalties (its processor order).
        logits_processors=None if grammar is None else [*sampling.processors(), grammar],
        constraint=p.constraint,
        seed=p.seed,
        logprob=p.logprobs,
        top_logprobs=max(p.top_logprobs, 0),
        snapshot_at=prompt.cuts,
        adapter=served.adapter,  # a LoRA adapter's name as the request's model (lora.py)
        speculation=None
        if vision is not None
        else served.draft_speculation(p, config) or row_speculation(served, p, config, max_tokens),
        input_embeddings=None if vision is None else vision.embeddings,
        model_kwargs=None if vision is None else vision.model_kwargs,
        cache_key=None if vision is None else vision.cache_key,
        sampler=None if vision is None else sampler_for(served, p),
    )
