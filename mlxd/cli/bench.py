"""`mlxd bench`: side-by-side benchmarks against mlx-lm (`mlxd bench generate`), flags by layer."""

import argparse
import sys

from ..bench.models import SHAPES

DTYPES = ("bfloat16", "float16", "float32")


def _model_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (L1): exactly one of --model / --random-shape")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=str, help="a model reference, as `mlxd generate --model`")
    src.add_argument(
        "--random-shape",
        choices=sorted(SHAPES),
        help="random weights in a real architecture's shape, built in memory (no files)",
    )
    g.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="weight dtype (default: bfloat16 for --random-shape, the model's own for --model)",
    )


def _engine_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (L3)")
    g.add_argument(
        "--concurrent",
        type=int,
        default=0,
        metavar="N",
        help="also run N >= 2 streams admitted together (BatchGenerator vs Engine.submit_many)",
    )
    g.add_argument(
        "--prefill-step-size", type=int, default=2048, help="prompt tokens per prefill chunk"
    )


def _workload_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (greedy, random token prompts, EOS ignored)")
    g.add_argument("--prompt-tokens", type=int, default=512, help="prompt length")
    g.add_argument("--gen-tokens", type=int, default=128, help="tokens generated per stream")
    g.add_argument(
        "--rounds", type=int, default=5, help="single-stream rounds (A B pairs); 0 skips it"
    )
    g.add_argument(
        "--concurrent-rounds", type=int, default=None, help="concurrent rounds (default: --rounds)"
    )
    g.add_argument("--warmup", type=int, default=1, help="untimed A B pairs before each mode")
    g.add_argument(
        "--order",
        choices=("ab", "alternate"),
        default="ab",
        help="ab: mlx-lm then mlxd every round; alternate: A B, B A, A B, ...",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for random weights and prompts")


def _output_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output (L4)")
    g.add_argument("--json", type=str, default=None, metavar="OUT", help="write every raw number")


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "bench",
        help="benchmark mlxd against mlx-lm side by side",
        description="Benchmarks that run mlx-lm and mlxd on the same model in one process.",
    )
    bench_subs = p.add_subparsers(dest="bench_command", metavar="BENCH")
    g = bench_subs.add_parser(
        "generate",
        help="single-stream and concurrent generation, mlxd vs mlx-lm",
        description="Interleaved rounds of mlx-lm and mlxd on one model: prefill and decode "
        "tok/s, TTFT, inter-token latency, peak memory; ratios mlxd/mlx-lm with their spread.",
    )
    for group in (_model_group, _engine_group, _workload_group, _output_group):
        group(g)
    p.set_defaults(bench_parser=p)


def run(args: argparse.Namespace) -> None:
    if args.bench_command is None:
        args.bench_parser.print_help()
        sys.exit(2)
    if args.concurrent == 1 or args.concurrent < 0:
        sys.exit("mlxd bench generate: --concurrent needs N >= 2 (N = 1 is the single stream)")
    if args.gen_tokens < 2 or args.prompt_tokens < 1:
        sys.exit("mlxd bench generate: needs --gen-tokens >= 2 and --prompt-tokens >= 1")
    if args.concurrent_rounds is None:
        args.concurrent_rounds = args.rounds
    del args.bench_parser  # not JSON material
    from ..bench.generate import run_bench

    if code := run_bench(args):
        sys.exit(code)
