"""`mlxd bench`: side-by-side benchmarks against mlx-lm (`mlxd bench generate`, in process;
`mlxd bench serve`, two HTTP servers; `mlxd bench prefix`, the prompt store), flags by layer."""

import argparse
import sys

from ..bench.models import SHAPES
from .bench_serve import add_serve_parser, agents, run_serve_cmd
from .serve import add_step_size_and_attention

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
    add_step_size_and_attention(
        g,
        "mlxd's batched decode attention, as `mlxd serve --batched-attention` (every mode but "
        "mlx changes bits on CUDA: its token check is reported, not enforced)",
    )
    g.add_argument(
        "--decode-step",
        choices=("rows", "rows+fused", "mlx"),
        default="rows",
        help="the --concurrent engine's one-token step, as `mlxd serve --decode-step` (the same "
        "bits either way)",
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
    g.add_argument(
        "--kv-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
        help="single stream: quantized KV on both sides (mlx-lm's --kv-bits)",
    )  # fmt: skip
    g.add_argument("--kv-group-size", type=int, default=64, help="with --kv-bits (64)")
    g.add_argument(
        "--adapter-path", default=None,
        help="single stream: a LoRA adapter, applied by mlx-lm's load_adapters on its side and "
        "loaded into mlxd's engine (a request naming it, as --lora-modules serves it) on mlxd's",
    )  # fmt: skip
    g.add_argument(
        "--quantized-kv-start", type=int, default=0,
        help="with --kv-bits: quantize from this many tokens on (0: from the prompt)",
    )  # fmt: skip
    g.add_argument(
        "--ban-tokens",
        type=int,
        default=0,
        metavar="K",
        help="concurrent streams get logit_bias -100 on K token ids, as `bench serve` bans EOS",
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


def _sections(text: str) -> list[str]:
    from ..bench.prefix import SECTIONS

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in SECTIONS for n in names):
        raise argparse.ArgumentTypeError(f"sections are some of {','.join(SECTIONS)}: {text!r}")
    return [n for n in SECTIONS if n in names]  # run in the documented order


def _prefix_parser(bench_subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    s = bench_subs.add_parser(
        "prefix",
        help="the prompt prefix store: shared-prefix and restart TTFT, fleet with store on / off",
        description="What mlxd serve's prefix store saves, as ratios: (agents) a second agent's "
        "TTFT with a stored system prompt vs cold; (restart) TTFT restored from --ssd-cache after "
        "a restart vs a re-prefill; (fleet) bench serve's agent fleet with the store on and off.",
    )
    w = s.add_argument_group("workload (greedy by default; EOS and control tokens banned)")
    w.add_argument("--model", default=None, help="local MLX model folder (default: embedded)")
    w.add_argument(
        "--sections", type=_sections, default=["agents", "restart", "fleet"],
        help="which to run, comma-separated (default agents,restart,fleet)",
    )  # fmt: skip
    w.add_argument("--prefix-tokens", type=int, default=8192, help="shared system prompt (8192)")
    w.add_argument("--rounds", type=int, default=3, help="rounds of sections 1-2 (default 3)")
    w.add_argument("--max-tokens", type=int, default=16, help="reply tokens, sections 1-2 (16)")
    w.add_argument("--agents", type=agents, default=[8], help="fleet N values (default 8)")
    w.add_argument("--turns", type=int, default=4, help="fleet turns per agent (default 4)")
    w.add_argument("--fleet-max-tokens", type=int, default=None, help="default: --max-tokens")
    w.add_argument("--fleet-rounds", type=int, default=1, help="fleet runs per N and mode (1)")
    w.add_argument("--seed", type=int, default=0, help="seed of the prompt words")
    v = s.add_argument_group("servers")
    v.add_argument("--mlxd-args", default="", help="extra flags for every mlxd serve, one string")
    v.add_argument(
        "--stop-signal", choices=("INT", "TERM"), default="INT",
        help="how the restart section stops server 1 (default INT, as Ctrl-C)",
    )  # fmt: skip
    v.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to ready")
    o = s.add_argument_group("output")
    o.add_argument("--json", default=None, metavar="OUT", help="every raw number")
    o.add_argument("--markdown", default=None, metavar="OUT.md", help="the tables")
    o.add_argument("--log-dir", default=None, help="server logs and SSD caches (default: temp)")


def _run_prefix(args: argparse.Namespace) -> None:
    if args.fleet_max_tokens is None:
        args.fleet_max_tokens = args.max_tokens
    counts = (args.prefix_tokens, args.rounds, args.max_tokens, args.turns, args.fleet_rounds)
    if min(*counts, args.fleet_max_tokens) < 1:
        sys.exit("mlxd bench prefix: token counts, --rounds, --turns must be >= 1")
    from ..bench.prefix import run_prefix

    if code := run_prefix(args):
        sys.exit(code)


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
    add_serve_parser(bench_subs)
    _prefix_parser(bench_subs)
    p.set_defaults(bench_parser=p)


def run(args: argparse.Namespace) -> None:
    if args.bench_command is None:
        args.bench_parser.print_help()
        sys.exit(2)
    del args.bench_parser  # not JSON material
    if args.bench_command == "serve":
        return run_serve_cmd(args)
    if args.bench_command == "prefix":
        return _run_prefix(args)
    if args.concurrent == 1 or args.concurrent < 0:
        sys.exit("mlxd bench generate: --concurrent needs N >= 2 (N = 1 is the single stream)")
    if args.gen_tokens < 2 or args.prompt_tokens < 1:
        sys.exit("mlxd bench generate: needs --gen-tokens >= 2 and --prompt-tokens >= 1")
    if args.concurrent_rounds is None:
        args.concurrent_rounds = args.rounds
    from ..bench.generate import run_bench

    if code := run_bench(args):
        sys.exit(code)
