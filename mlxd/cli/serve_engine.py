"""`mlxd serve`'s engine (L3) flags: rows, prefill waves, the batched step's modes, CUDA
switches, the GIL's interval, admission budgets."""

import argparse
from typing import Any

from mlx_lm.utils import _parse_size

from ..model.folded_attention import MODES


def _wave_tokens(value: str) -> int:
    """`--prefill-batch-tokens`: a token count, or auto (-1: resolved with the other flags)."""
    if value == "auto":
        return -1
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("must be auto or a token count >= 0")
    return n


def engine_group(p: argparse.ArgumentParser) -> None:
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
    add_step_size_and_attention(g, SERVE_ATTENTION_HELP)
    g.add_argument(
        "--decode-step",
        choices=("rows", "rows+fused", "mlx"),
        default="rows",
        help="the one-token decode step of a lone request and of --batched-attention mlx's "
        "batch: rows (mlx-lm's kernels over 2-D rows, ~23 fewer view nodes a layer for llama, "
        "mistral, qwen2, qwen3, qwen3_moe, gemma3 and phi3 models with unquantized weights: less "
        "host time a token, the same bits), rows+fused (rows, and a lone row's q/k/v and "
        "gate/up as one matmul each: the same bits on CUDA and the CPU, not checked on Metal; "
        "the weights stacked in place, no memory added; opt-in until measured) or mlx (mlx-lm's "
        "model "
        "call as it is)",
    )
    g.add_argument(
        "--prefill-clear-cache",
        choices=("auto", "on", "off"),
        default="auto",
        help="mx.clear_cache() after each prefill chunk, as mlx-lm does, and when a row or a "
        "batch ends (auto: off on CUDA, where a clear costs 0.1-0.4 s with an 8B model's "
        "buffers; on elsewhere; same bits; without clears the cache grows to MLX's memory "
        "limit, which --memory-budget sets)",
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
        help="MLX-CUDA's graph capture (MLX_USE_CUDA_GRAPHS): on is faster for a lone row and, "
        "with the thread step order, for 32 rows too (1.01-1.03x off's tok/s on an H100, "
        "session 48); off was faster at 32 rows before that order (docs/cli.md)",
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
        "--step-order",
        choices=("pipelined", "wait", "split", "thread"),
        default=None,
        help="when a batched decode step is queued: pipelined (mlx-lm's, a step ahead), wait "
        "(after the last step's tokens are read: every KV write in place), split (its first "
        "third of layers before that read, the rest after), thread (split's read and queueing "
        "on a thread of its own while the engine builds the next); the same bits. "
        "On an H100 thread decoded 32 agents 1.055-1.077x faster than split on a 0.6B model and "
        "1.056x faster than pipelined on an 8B one (default: MLXD_STEP_ORDER, else thread on "
        "NVIDIA GPUs and pipelined elsewhere)",
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


SERVE_ATTENTION_HELP = (
    "attention of the batched decode step: mlx (MLX's, the same bits as mlx-lm) or folded (no "
    "masked fallback: much faster on CUDA at long contexts, changes bits there; llama, mistral, "
    "qwen2, qwen3, qwen3_moe; keep mlx on Metal) or folded+fused (also q/k/v and gate/up as "
    "one matmul each: fewer kernel calls on CUDA, those weights stacked in place, no memory "
    "added) or flash / flash+fused (the attention as two CUDA kernels, float32 softmax: CUDA "
    "only, changes bits, faster only at short contexts); +shared: a decoding wave's common "
    "prefix (>= 512 tokens, e.g. a fleet's system prompt) held once, not once per row "
    "(changes bits)"
)


def add_step_size_and_attention(g: Any, attention_help: str) -> None:
    """`--prefill-step-size` and `--batched-attention`, shared by `mlxd serve` and `mlxd bench
    generate` (each with its own help for the attention)."""
    g.add_argument(
        "--prefill-step-size", type=int, default=2048, help="prompt tokens per prefill chunk"
    )
    g.add_argument("--batched-attention", choices=MODES, default="mlx", help=attention_help)
