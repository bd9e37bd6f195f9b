"""`mlxd serve`: every `mlx_lm.server` flag with its default, plus mlxd's, grouped by layer."""

import argparse
import faulthandler
import json
import os
import sys

from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START
from mlx_lm.utils import _parse_size

from ..model.default import DEFAULT_MODEL_NAME
from .generate import KV_CONFIG_FLAG, resolve_kv_config
from .serve_engine import engine_group


def _model_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (L1)")
    g.add_argument(
        "--model",
        type=str,
        help="local model folder, Hugging Face repo id (local cache first) or .gguf file; "
        f"default: the embedded {DEFAULT_MODEL_NAME}",
    )
    g.add_argument(
        "--adapter-path", type=str, help="Optional path for the trained adapter weights and config."
    )
    g.add_argument(
        "--draft-model",
        type=str,
        default=None,
        help="A model for speculative decoding (refused at start: the engine has no drafting yet)",
    )
    g.add_argument("--num-draft-tokens", type=int, default=3, help="Tokens to draft per step.")
    g.add_argument(
        "--trust-remote-code", action="store_true", help="Enable trusting remote code for tokenizer"
    )
    g.add_argument(
        "--chat-template", type=str, default="", help="Specify a chat template for the tokenizer"
    )
    g.add_argument(
        "--use-default-chat-template", action="store_true", help="Use the default chat template"
    )
    g.add_argument(
        "--chat-template-args",
        type=json.loads,
        default="{}",
        help="JSON arguments for the tokenizer's apply_chat_template, e.g. "
        "'{\"enable_thinking\":false}'",
    )


def _kv_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV cache (L2) and prompt store (L0)")
    g.add_argument("--kv-bits", type=int, default=None, help="KV cache quantization bits (4 or 8)")
    g.add_argument("--kv-group-size", type=int, default=64, help="KV quantization group size")
    g.add_argument(
        "--quantized-kv-start",
        type=int,
        default=DEFAULT_QUANTIZED_KV_START,
        help=f"Token position to start KV quantization (default: {DEFAULT_QUANTIZED_KV_START}; "
        "with --kv-config it means 0, as optiq serve)",
    )
    g.add_argument("--kv-config", **KV_CONFIG_FLAG)
    g.add_argument(
        "--prompt-cache-size",
        type=int,
        default=10,
        help="Maximum number of distinct KV caches in the prompt cache",
    )
    g.add_argument(
        "--prompt-cache-bytes", type=_parse_size, help="Maximum size in bytes of the KV caches"
    )
    g.add_argument(
        "--ssd-cache",
        type=str,
        default=None,
        metavar="DIR",
        help="keep prompt caches on disk in DIR too: they survive restarts and RAM evictions",
    )
    g.add_argument(
        "--ssd-cache-max",
        type=_parse_size,
        default="32GB",
        help="maximum bytes of the disk tier (least recently used files go first)",
    )
    g.add_argument(
        "--ssd-demote-idle",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with --ssd-cache: prompt caches unused this long leave RAM for disk",
    )
    g.add_argument(
        "--prefix-deterministic",
        action="store_true",
        help="a prompt-cache hit gives the same bits as a miss: prefill chunks and hits on a "
        "fixed grid of --prefill-step-size tokens, for rows prefilled alone",
    )


def _http_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server (L4)")
    g.add_argument("--host", type=str, default="127.0.0.1", help="Host (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="Port (default: 8080)")
    g.add_argument(
        "--allowed-origins",
        type=lambda x: x.split(","),
        default="*",
        help="Allowed CORS origins, comma separated (default: *)",
    )
    g.add_argument(
        "--api-key",
        type=str,
        default=None,
        help="require this key on every endpoint but /health (default: $MLXD_API_KEY)",
    )
    g.add_argument(
        "--data-dir",
        type=str,
        default=None,
        help="where stored responses live (default: $MLXD_HOME/data)",
    )
    g.add_argument(
        "--config",
        type=str,
        default=None,
        help='a JSON file of options (keys are flag names, e.g. {"batch": 16}); flags given '
        "on the command line win",
    )
    g.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop, as uvicorn's --loop (default: auto, uvloop where installed)",
    )
    g.add_argument(
        "--http",
        choices=("auto", "h11", "httptools"),
        default="auto",
        help="HTTP parser, as uvicorn's --http (default: auto, httptools where installed)",
    )
    g.add_argument(
        "--log-level",
        type=str,
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="Set the logging level (default: INFO)",
    )


def _sampling_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling defaults (L3)")
    g.add_argument("--temp", type=float, default=0.0, help="Default sampling temperature")
    g.add_argument("--top-p", type=float, default=1.0, help="Default nucleus sampling top-p")
    g.add_argument("--top-k", type=int, default=0, help="Default top-k sampling (0 disables)")
    g.add_argument("--min-p", type=float, default=0.0, help="Default min-p sampling (0 disables)")
    g.add_argument("--max-tokens", type=int, default=512, help="Default maximum tokens")


_defaults: dict = {}


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "serve",
        help="an OpenAI / Anthropic compatible HTTP server (drop-in for mlx_lm.server)",
        description="Serve a model over HTTP: mlx_lm.server's API, Anthropic Messages and "
        "OpenAI Responses, on one continuous-batching engine.",
    )
    for group in (_model_group, _kv_group, engine_group, _sampling_group, _http_group):
        group(p)
    _defaults.update({a.dest: a.default for a in p._actions if a.dest != "help"})


def run(args: argparse.Namespace) -> None:
    from ..engine import step_order
    from ..engine.gil import step_phases
    from ..kv import additive_mask, roll_kernel
    from ..serve.main import apply_config, serve

    apply_config(args, _defaults)
    resolve_kv_config(args)
    try:  # the environment's engine switches, checked before a model loads
        args.step_order = step_order.order(args.step_order)
        step_order.split_fraction()
        step_order.thread_rows()
        step_phases(args.switch_interval)
        additive_mask.enabled()
        roll_kernel.way()
    except ValueError as e:
        raise SystemExit(f"mlxd serve: error: {e}") from e
    if args.cuda_graphs == "off":  # read by MLX at its first GPU command, so before the model
        os.environ["MLX_USE_CUDA_GRAPHS"] = "0"
    if args.cudnn_attention == "off":  # MLX reads it once, at its first attention call
        os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "0"
    if isinstance(args.switch_interval, float):
        sys.setswitchinterval(args.switch_interval)
    # A native crash (MLX, CUDA) prints every thread's Python stack to stderr: the log then says
    # which thread was in which call (session 47's fleet died with none).
    try:
        faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file (an IDE's console)
        pass
    serve(args)
