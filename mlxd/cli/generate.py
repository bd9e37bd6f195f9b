"""`mlxd generate`: every `mlx_lm.generate` flag with its default, grouped by layer, and its
body: mlx_lm.generate's main() on mlxd's loader and generate()."""

import argparse
import json
import sys
from typing import Any

import mlx.core as mx
from mlx_lm.generate import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_P,
    DEFAULT_MIN_TOKENS_TO_KEEP,
    DEFAULT_PREFILL_STEP_SIZE,
    DEFAULT_PROMPT,
    DEFAULT_QUANTIZED_KV_START,
    DEFAULT_SEED,
    DEFAULT_TEMP,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    DEFAULT_XTC_PROBABILITY,
    DEFAULT_XTC_THRESHOLD,
    str2bool,
)
from mlx_lm.models.cache import QuantizedKVCache, load_prompt_cache

from ..config import DEFAULT_MODEL_NAME, KV_CONFIG_HELP
from ..engine import SamplingParams, generate
from ..kv.mixed import check
from ..kv.schemes import unsupported
from ..model import ModelLoadError, load

KV_CONFIG_FLAG = dict(type=str, default=None, metavar="PATH", help=KV_CONFIG_HELP)


def resolve_kv_config(args: argparse.Namespace) -> None:
    """Load --kv-config into args.kv_config (a kv.mixed.MixedKV). With it, --quantized-kv-start
    left at mlx-lm's default means optiq serve's default, 0 (so the two give the same bits)."""
    from ..kv.mixed import from_flags

    try:
        args.kv_config = from_flags(getattr(args, "kv_config", None), args.kv_bits)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e
    if args.kv_config is not None and args.quantized_kv_start == DEFAULT_QUANTIZED_KV_START:
        args.quantized_kv_start = 0


def _model_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (L1)")
    g.add_argument(
        "--model",
        type=str,
        default=None,
        help="local model folder, Hugging Face repo id (local cache first) or .gguf "
        f"file; default: the embedded {DEFAULT_MODEL_NAME}",
    )
    g.add_argument(
        "--trust-remote-code", action="store_true", help="Enable trusting remote code for tokenizer"
    )
    g.add_argument(
        "--adapter-path", type=str, help="Optional path for the trained adapter weights and config."
    )
    g.add_argument(
        "--quantize-activations",
        "-qa",
        action="store_true",
        help="Quantize activations using the same quantization config as the corresponding layer.",
    )
    g.add_argument(
        "--draft-model", type=str, default=None, help="A model to be used for speculative decoding."
    )


def _kv_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV cache (L2)")
    g.add_argument(
        "--max-kv-size", type=int, default=None, help="Set the maximum key-value cache size"
    )
    g.add_argument(
        "--kv-bits",
        type=int,
        default=None,
        help="Number of bits for KV cache quantization. Defaults to no quantization.",
    )
    g.add_argument(
        "--kv-group-size", type=int, default=64, help="Group size for KV cache quantization."
    )
    g.add_argument(
        "--quantized-kv-start",
        type=int,
        default=DEFAULT_QUANTIZED_KV_START,
        help="When --kv-bits is set, start quantizing the KV cache from this step on "
        f"(with --kv-config, {DEFAULT_QUANTIZED_KV_START} means 0, as optiq serve).",
    )
    g.add_argument("--kv-config", **KV_CONFIG_FLAG)
    g.add_argument(
        "--prompt-cache-file",
        type=str,
        default=None,
        help="A file containing saved KV caches to avoid recomputing them",
    )


def _engine_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine: sampling and limits (L3)")
    g.add_argument(
        "--max-tokens",
        "-m",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="Maximum number of tokens to generate",
    )
    g.add_argument("--temp", type=float, default=DEFAULT_TEMP, help="Sampling temperature")
    g.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, help="Sampling top-p")
    g.add_argument("--min-p", type=float, default=DEFAULT_MIN_P, help="Sampling min-p")
    g.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="Sampling top-k")
    g.add_argument(
        "--xtc-probability",
        type=float,
        default=DEFAULT_XTC_PROBABILITY,
        help="Probability of XTC sampling to happen each next token",
    )
    g.add_argument(
        "--xtc-threshold",
        type=float,
        default=DEFAULT_XTC_THRESHOLD,
        help="Threshold the probs of each next token candidate to be sampled by XTC",
    )
    g.add_argument(
        "--min-tokens-to-keep",
        type=int,
        default=DEFAULT_MIN_TOKENS_TO_KEEP,
        help="Minimum tokens to keep for min-p sampling.",
    )
    g.add_argument("--seed", type=int, default=DEFAULT_SEED, help="PRNG seed")
    g.add_argument(
        "--extra-eos-token",
        type=str,
        default=(),
        nargs="+",
        help="Add tokens in the list of eos tokens that stop generation.",
    )
    g.add_argument(
        "--prefill-step-size",
        type=int,
        default=DEFAULT_PREFILL_STEP_SIZE,
        help=f"Number of prompt tokens to process at a time (default: {DEFAULT_PREFILL_STEP_SIZE})",
    )
    g.add_argument(
        "--num-draft-tokens",
        type=int,
        default=3,
        help="Number of tokens to draft when using speculative decoding.",
    )


def _prompt_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompt and output (L4)")
    g.add_argument(
        "--prompt",
        "-p",
        default=DEFAULT_PROMPT,
        help="Message to be processed by the model ('-' reads from stdin)",
    )
    g.add_argument(
        "--system-prompt", default=None, help="System prompt to be used for the chat template"
    )
    g.add_argument(
        "--prefill-response", default=None, help="Prefill response to be used for the chat template"
    )
    g.add_argument(
        "--image",
        type=str,
        default=(),
        nargs="+",
        help="Image files for the image placeholders of the prompt, in order.",
    )
    g.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="Use the raw prompt without the tokenizer's chat template.",
    )
    g.add_argument(
        "--use-default-chat-template", action="store_true", help="Use the default chat template"
    )
    g.add_argument(
        "--chat-template-config",
        default=None,
        help="Additional config for `apply_chat_template` as a JSON dict string.",
    )
    g.add_argument(
        "--verbose",
        type=str2bool,
        default=True,
        help="Log verbose output when 'True' or 'T' or only print the response when 'False' or 'F'",
    )


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for group in (_model_group, _kv_group, _engine_group, _prompt_group):
        group(p)
    return p


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "generate",
        help="generate text (mlx_lm.generate's flags and output)",
        description="Generate text from a prompt, exactly as mlx_lm.generate.",
    )
    configure(p)


def run(args: argparse.Namespace) -> None:
    resolve_kv_config(args)
    run_generate(args)


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
