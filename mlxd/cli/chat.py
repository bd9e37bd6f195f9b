"""`mlxd chat`: mlx_lm.chat's flags, defaults, keys and replies on mlxd's engine (one prompt
cache kept across turns), or, with --url, a chat against a running OpenAI-compatible server."""

import argparse
import json
from typing import Any

from mlx_lm.chat import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PREFILL_STEP_SIZE,
    DEFAULT_SEED,
    DEFAULT_TEMP,
    DEFAULT_TOP_P,
    DEFAULT_XTC_PROBABILITY,
)

from ..config import DEFAULT_MODEL_NAME
from ..model import ModelLoadError
from .chat_ui import ChatScreen, local_stats, think_markers

# mlx_lm.chat's own --xtc-threshold default (its DEFAULT_XTC_THRESHOLD constant says 0.0).
XTC_THRESHOLD = 0.1


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = p.add_argument_group("model (L1)")
    g.add_argument(
        "--model",
        type=str,
        default=None,
        help="local model folder, Hugging Face repo id (local cache first) or .gguf file; "
        f"default: the embedded {DEFAULT_MODEL_NAME}; with --url, the served model's name",
    )
    g.add_argument(
        "--trust-remote-code", action="store_true", help="Enable trusting remote code for tokenizer"
    )
    g.add_argument(
        "--adapter-path", type=str, help="Optional path for the trained adapter weights and config."
    )
    g = p.add_argument_group("KV cache (L2)")
    g.add_argument(
        "--max-kv-size", type=int, default=None, help="Set the maximum key-value cache size"
    )
    g = p.add_argument_group("engine: sampling and limits (L3)")
    g.add_argument("--temp", type=float, default=DEFAULT_TEMP, help="Sampling temperature")
    g.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, help="Sampling top-p")
    g.add_argument(
        "--xtc-probability",
        type=float,
        default=DEFAULT_XTC_PROBABILITY,
        help="Probability of XTC sampling to happen each next token",
    )
    g.add_argument(
        "--xtc-threshold",
        type=float,
        default=XTC_THRESHOLD,
        help="Threshold the probs of each next token candidate to be sampled by XTC",
    )
    g.add_argument("--seed", type=int, default=DEFAULT_SEED, help="PRNG seed")
    g.add_argument(
        "--prefill-step-size",
        type=int,
        default=DEFAULT_PREFILL_STEP_SIZE,
        help=f"Number of prompt tokens to process at a time (default: {DEFAULT_PREFILL_STEP_SIZE})",
    )
    g.add_argument(
        "--max-tokens",
        "-m",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="Maximum number of tokens to generate",
    )
    g.add_argument(
        "--pipeline",
        action="store_true",
        help="Use pipelining instead of tensor parallelism (mlx_lm.chat's distributed mode; "
        "mlxd chat runs on one device)",
    )
    g = p.add_argument_group("prompt and output (L4)")
    g.add_argument(
        "--system-prompt", default=None, help="System prompt to be used for the chat template"
    )
    g.add_argument(
        "--chat-template-config",
        default=None,
        help="Additional config for `apply_chat_template` as a JSON dict string.",
    )
    g = p.add_argument_group("remote: a running server instead of a local model")
    g.add_argument(
        "--url",
        default=None,
        metavar="URL",
        help="chat with the OpenAI-compatible server at URL (e.g. http://127.0.0.1:8080) by "
        "streaming /v1/chat/completions; the conversation is kept here",
    )
    g.add_argument("--api-key", default=None, help="the server's API key (sent as a Bearer token)")
    return p


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "chat",
        help="chat in the terminal (mlx_lm.chat's flags and keys; --url for a running server)",
        description="Chat with a model, exactly as mlx_lm.chat (q quits, r resets the "
        "conversation, h prints help); with --url, with a running server.",
    )
    configure(p)


def template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if not args.chat_template_config:
        return {}
    try:
        kwargs = json.loads(args.chat_template_config)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"--chat-template-config is not JSON ({e})") from e
    if not isinstance(kwargs, dict):
        raise ModelLoadError("--chat-template-config must be a JSON object")
    return kwargs


def run(args: argparse.Namespace) -> None:
    if args.url is not None:
        from .chat_remote import run_remote

        run_remote(args, template_kwargs(args))
        return
    run_local(args)


def run_local(args: argparse.Namespace) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..engine import SamplingParams, stream_generate
    from ..model import load

    kwargs = template_kwargs(args)
    mx.random.seed(args.seed)
    model, tokenizer = load(
        args.model,
        adapter_path=args.adapter_path,
        tokenizer_config={"trust_remote_code": args.trust_remote_code},
        trust_remote_code=args.trust_remote_code,
    )
    markers = think_markers(tokenizer)
    screen = ChatScreen()
    rows = [("model", str(args.model or DEFAULT_MODEL_NAME))]
    if args.adapter_path:
        rows.append(("adapter", str(args.adapter_path)))
    rows.append(("max tokens", f"{args.max_tokens:,}"))
    if args.system_prompt:
        sp = args.system_prompt
        rows.append(("system", sp if len(sp) <= 60 else sp[:57] + "..."))
    screen.header(rows)

    prompt_cache = make_prompt_cache(model, args.max_kv_size)
    while (query := screen.prompt()) is not None:
        if query == "q":
            break
        if query == "r":
            prompt_cache = make_prompt_cache(model, args.max_kv_size)
            screen.say("  reset context cleared")
            continue
        if query == "h":
            screen.help()
            continue
        # As mlx_lm.chat: each turn templates only its own messages; the cache holds the rest.
        messages = []
        if args.system_prompt is not None:
            messages.append({"role": "system", "content": args.system_prompt})
        messages.append({"role": "user", "content": query})
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        sampler = SamplingParams(
            temp=args.temp,
            top_p=args.top_p,
            xtc_probability=args.xtc_probability,
            xtc_threshold=args.xtc_threshold,
            xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
        ).sampler()
        reply = screen.reply(markers, opens_reasoning(tokenizer, prompt, markers[0]))
        last = None
        for last in stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=args.max_tokens,
            sampler=sampler,
            prompt_cache=prompt_cache,
            prefill_step_size=args.prefill_step_size,
        ):
            reply.write(last.text)
        reply.close()
        if last is not None:
            screen.stats(local_stats(last))
    screen.say("bye")


def opens_reasoning(tokenizer: Any, prompt: list[int], start: str) -> bool:
    """Whether the templated prompt ends inside reasoning (templates that open <think>)."""
    tail = tokenizer.decode(prompt[-4:]) if prompt else ""
    return tail.rstrip().endswith(start)
