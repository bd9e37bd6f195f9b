"""The body of `mlxd generate`: mlx_lm.generate's main(), on mlxd's loader and generate()."""

import argparse
import json
import sys
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache, load_prompt_cache

from ..engine import SamplingParams, generate
from ..kv.mixed import check
from ..kv.schemes import unsupported
from ..model import ModelLoadError, load


def _load_cache(args: argparse.Namespace) -> tuple[Any, dict | None]:
    if args.prompt_cache_file is None:
        return None, None
    try:
        cache, metadata = load_prompt_cache(args.prompt_cache_file, return_metadata=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{args.prompt_cache_file}: cannot read prompt cache ({e})") from e
    if isinstance(cache[0], QuantizedKVCache):
        if args.kv_bits is not None and args.kv_bits != cache[0].bits:
            raise ValueError(
                "--kv-bits does not match the kv cache loaded from --prompt-cache-file."
            )
        if args.kv_group_size != cache[0].group_size:
            raise ValueError(
                "--kv-group-size does not match the kv cache loaded from --prompt-cache-file."
            )
    return cache, metadata


def _check_kv_config(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """`--kv-config` (loaded by resolve_kv_config) checked against the model before any work:
    the generate() keyword to pass, empty without one."""
    cfg = getattr(args, "kv_config", None)
    if cfg is None:
        return {}
    if args.draft_model is not None:
        raise ModelLoadError("--kv-config does not run with --draft-model yet")
    try:
        check(model, cfg, args.max_kv_size)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e
    # As optiq converts them, sliding-window layers named in the file are quantized too.
    if (why := unsupported(model, cfg, args.max_kv_size)) is not None:
        raise ModelLoadError(why)
    return {"kv_config": cfg, "quantize_windows": True}


def _template(args: argparse.Namespace, tokenizer: Any, prompt: str, using_cache: bool) -> str:
    kwargs = json.loads(args.chat_template_config) if args.chat_template_config else {}
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    messages.append({"role": "user", "content": prompt})
    has_prefill = args.prefill_response is not None
    if has_prefill:
        messages.append({"role": "assistant", "content": args.prefill_response})
    flags = {"continue_final_message": has_prefill, "add_generation_prompt": not has_prefill}
    text = tokenizer.apply_chat_template(messages, tokenize=False, **flags, **kwargs)
    if using_cache:
        # The cache holds the prefix: keep only the part from the query on (as mlx-lm).
        messages[-1]["content"] = "<query>"
        probe = tokenizer.apply_chat_template(messages, tokenize=False, **flags)
        text = text[probe.index("<query>") :]
    return text


def run_generate(args: argparse.Namespace) -> None:
    if args.seed is not None:
        mx.random.seed(args.seed)
    prompt_cache, metadata = _load_cache(args)
    using_cache = prompt_cache is not None
    tokenizer_config = json.loads(metadata["tokenizer_config"]) if using_cache else {}
    tokenizer_config["trust_remote_code"] = args.trust_remote_code
    model_ref = args.model
    if using_cache:
        if model_ref is None:
            model_ref = metadata["model"]
        elif model_ref != metadata["model"]:
            raise ValueError(
                f"Providing a different model ({model_ref}) than that used to create the "
                f"prompt cache ({metadata['model']}) is an error."
            )
    model, tokenizer, config = load(
        model_ref,
        adapter_path=args.adapter_path,
        tokenizer_config=tokenizer_config,
        model_config={"quantize_activations": args.quantize_activations},
        return_config=True,
        trust_remote_code=args.trust_remote_code,
    )
    for eos_token in args.extra_eos_token:
        tokenizer.add_eos_token(eos_token)
    kv_config = _check_kv_config(args, model)

    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    prompt = sys.stdin.read() if prompt == "-" else prompt
    use_chat_template = not args.ignore_chat_template and tokenizer.has_chat_template
    if use_chat_template:
        prompt = _template(args, tokenizer, prompt, using_cache)

    pixel_values = None
    if args.image:
        from mlx_lm.processors import load_processor

        processor = load_processor(model, config)
        if processor is None:
            raise ModelLoadError(f"The model {model_ref} does not take images.")
        import numpy as np
        from PIL import Image

        images = [np.asarray(Image.open(f).convert("RGB")) for f in args.image]
        prompt, pixel_values = processor(prompt, images=images)
    tokens = tokenizer.encode(prompt, add_special_tokens=not use_chat_template)
    input_embeddings = None
    if pixel_values is not None:
        input_embeddings = model.embed_inputs(mx.array(tokens), pixel_values=pixel_values)
        mx.eval(input_embeddings)

    draft_model = None
    if args.draft_model is not None:
        draft_model, draft_tokenizer = load(args.draft_model)
        if draft_tokenizer.vocab_size != tokenizer.vocab_size:
            raise ModelLoadError("Draft model tokenizer does not match model tokenizer.")
    sampler = SamplingParams(
        temp=args.temp,
        top_p=args.top_p,
        min_p=args.min_p,
        min_tokens_to_keep=args.min_tokens_to_keep,
        top_k=args.top_k,
        xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold,
        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
    ).sampler()
    response = generate(
        model,
        tokenizer,
        tokens,
        max_tokens=args.max_tokens,
        verbose=args.verbose,
        sampler=sampler,
        max_kv_size=args.max_kv_size,
        prefill_step_size=args.prefill_step_size,
        prompt_cache=prompt_cache,
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
        quantized_kv_start=args.quantized_kv_start,
        **kv_config,
        draft_model=draft_model,
        num_draft_tokens=args.num_draft_tokens,
        input_embeddings=input_embeddings,
    )
    if not args.verbose:
        print(response)
