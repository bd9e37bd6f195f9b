"""`mlxd serve`: every `mlx_lm.server` flag with its default, plus mlxd's, grouped by layer."""

import argparse
import json
import os
import sys

from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START
from mlx_lm.utils import _parse_size

from ..model.default import DEFAULT_MODEL_NAME
from ..model.folded_attention import MODES
from .generate import KV_CONFIG_FLAG, resolve_kv_config


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


def _wave_tokens(value: str) -> int:
    """`--prefill-batch-tokens`: a token count, or auto (-1: resolved with the other flags)."""
    if value == "auto":
        return -1
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("must be auto or a token count >= 0")
    return n


def _engine_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (L3)")
    g.add_argument(
        "--batch",
        "--decode-concurrency",
        dest="batch",
        type=int,
        default=None,
        help="maximum concurrent rows; more requests wait in the queue (default: 8, and 32 on "
        "NVIDIA GPUs, where 32 agents on 8 rows waited 3x longer for a first token than on 32)",
    )
    g.add_argument(
        "--prompt-concurrency",
        type=int,
        default=8,
        help="prompts prefilled together when they join the batch (default: 8)",
    )
    g.add_argument(
        "--prefill-batch-tokens",
        type=_wave_tokens,
        default=-1,
        help="more prompts prefill together than --prompt-concurrency while rows x the longest "
        "chunk stays within this many tokens, so agents coming back at once join in one wave, "
        "not one per 8 rows (H200, 32 agents on an 8B model: 1.27x tok/s); auto (default): "
        "--prompt-concurrency x --prefill-step-size, mlx-lm's largest wave; 0: mlx-lm's count",
    )
    g.add_argument(
        "--prefill-step-size", type=int, default=2048, help="prompt tokens per prefill chunk"
    )
    g.add_argument(
        "--batched-attention",
        choices=MODES,
        default="mlx",
        help="attention of the batched decode step: mlx (MLX's, the same bits as mlx-lm) or "
        "folded (no masked fallback: much faster on CUDA at long contexts, changes bits there; "
        "llama, mistral, qwen2, qwen3, qwen3_moe; keep mlx on Metal) or folded+fused (also "
        "q/k/v and gate/up as one matmul each: fewer kernel calls on CUDA, copies those "
        "weights, e.g. +9 GB for an 8B model) or flash / flash+fused (the attention as two "
        "CUDA kernels, float32 softmax: CUDA only, changes bits, faster only at short contexts); "
        "+shared: a decoding wave's common prefix (>= 512 tokens, e.g. a fleet's system "
        "prompt) held once, not once per row (changes bits)",
    )
    g.add_argument(
        "--decode-step",
        choices=("rows", "mlx"),
        default="rows",
        help="the one-token decode step of a lone request and of --batched-attention mlx's "
        "batch: rows (mlx-lm's kernels over 2-D rows, ~23 fewer view nodes a layer for llama, "
        "mistral, qwen2, qwen3, qwen3_moe, gemma3 and phi3 models with unquantized weights: less "
        "host time a token, the same bits) or mlx (mlx-lm's model call as it is)",
    )
    g.add_argument(
        "--prefill-clear-cache",
        choices=("auto", "on", "off"),
        default="auto",
        help="mx.clear_cache() after each prefill chunk, as mlx-lm does, and when a row or a "
        "batch ends (auto: off on CUDA, where a clear costs 0.1-0.4 s with an 8B model's "
        "buffers; on elsewhere; same bits)",
    )
    g.add_argument(
        "--batched-sampling",
        choices=("auto", "on", "off"),
        default="auto",
        help="sample batched rows whose samplers differ (every request with a temperature) in "
        "a few batched calls, each row with its own draw: mlx-lm's tokens, tested on the CPU "
        "and MLX-CUDA (auto: on there; off on Metal until run there)",
    )
    g.add_argument(
        "--cuda-graphs",
        choices=("on", "off"),
        default="on",
        help="MLX-CUDA's graph capture (MLX_USE_CUDA_GRAPHS): off made 32 batched rows of an 8B "
        "model decode 1.5x faster on an H200 and one lone row slower (docs/performance.md)",
    )
    g.add_argument(
        "--cudnn-attention",
        choices=("on", "off"),
        default="on",
        help="MLX-CUDA's cuDNN attention for prefill (MLX_CUDA_USE_CUDNN_SDPA): cuDNN builds a "
        "graph per new shape, so a lone join's prefill took 0.093 s at the median on an H200 "
        "against 0.026 s off; off uses MLX's own kernels, whose bits differ from mlx_lm.server's",
    )
    g.add_argument(
        "--switch-interval",
        type=_switch_interval,
        default=None,
        help="seconds a thread may hold the GIL while another waits for it (Python's "
        "sys.setswitchinterval; default: Python's 0.005), or 'engine': Python's while the "
        "engine builds a batched step, 0.2 ms around its device waits and while a lone row "
        "decodes (engine/gil.py)",
    )
    g.add_argument(
        "--join-window",
        type=_window,
        default=0.25,
        help="seconds a new prefill wave may wait for requests the server has received and "
        "not yet queued (body, chat template, tokenizing), or for the next turns of replies "
        "that just ended, so an agent fleet's turns that arrive together prefill in one "
        "wave; a lone request never waits; 0: off "
        "(default: 0.25; same bits for a given batch, docs/performance.md)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests that may wait for a row; beyond it: 429 with Retry-After (default: 256)",
    )
    g.add_argument(
        "--kv-budget",
        type=_parse_size,
        default=None,
        help="bytes of KV cache the running rows may reserve (e.g. 8GB); a row waits until its "
        "worst case fits",
    )
    g.add_argument(
        "--memory-budget",
        type=str,
        default=None,
        help="total memory for weights and KV, in bytes or as a percentage of the machine's "
        "memory (e.g. 24GB or 75%%); sets the KV budget to what the weights leave, and MLX's "
        "memory limit (past it, its buffer cache gives memory back)",
    )
    g.add_argument(
        "--pipeline", action="store_true", help="Use pipelining instead of tensor parallelism"
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
    for group in (_model_group, _kv_group, _engine_group, _sampling_group, _http_group):
        group(p)
    _defaults.update({a.dest: a.default for a in p._actions if a.dest != "help"})


def _switch_interval(text: str) -> float | str:
    if text == "engine":
        return text
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"'engine' or a positive number of seconds, not {text!r}")
    return value


def _window(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"seconds between 0 and 10, not {text!r}")
    return value


def run(args: argparse.Namespace) -> None:
    from ..serve.main import apply_config, serve

    apply_config(args, _defaults)
    resolve_kv_config(args)
    if args.cuda_graphs == "off":  # read by MLX at its first GPU command, so before the model
        os.environ["MLX_USE_CUDA_GRAPHS"] = "0"
    if args.cudnn_attention == "off":  # MLX reads it once, at its first attention call
        os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "0"
    if isinstance(args.switch_interval, float):
        sys.setswitchinterval(args.switch_interval)
    serve(args)
