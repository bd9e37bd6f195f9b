"""`mlxd generate`: every `mlx_lm.generate` flag with its default, grouped by layer."""

import argparse

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

from ..config import DEFAULT_MODEL_NAME, KV_CONFIG_HELP
from ..model.errors import ModelLoadError

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
    from .generate_run import run_generate

    resolve_kv_config(args)
    run_generate(args)
