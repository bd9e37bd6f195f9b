"""`mlxd bench serve`'s flags and checks: an agent fleet over HTTP, mlxd serve against
mlx_lm.server (mlxd/bench/serve.py runs it)."""

import argparse
import json
import sys

from ..bench.lora import parse_adapters
from ..bench.variants import parse_variant
from .optional import require


def agents(text: str) -> list[int]:
    try:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not ns or ns[0] < 1:
        raise argparse.ArgumentTypeError("agents must be integers >= 1, e.g. 1,8,32")
    return ns


def add_serve_parser(bench_subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    s = bench_subs.add_parser(
        "serve",
        help="agent fleet over HTTP, mlxd serve vs mlx_lm.server",
        description="N agents share one long system prompt and run T streamed chat turns each, "
        "all at once, against an mlxd server and an mlx_lm.server on the same model (one after "
        "the other, or interleaved round by round): output tok/s, TTFT and inter-chunk "
        "latency p50 / p99, peak RSS. --workload edit: each agent instead sends its own Python "
        "file and asks for it back with one change (the reply copies the prompt); "
        "--mlxd-variant adds mlxd servers with flags of their own, e.g. speculative decoding, "
        "with its acceptance where responses report it.",
    )
    w = s.add_argument_group("workload (greedy by default; EOS and control tokens banned)")
    w.add_argument("--model", default=None, help="local MLX model folder (default: embedded)")
    w.add_argument("--agents", type=agents, default=[1, 8, 32], help="N values (default 1,8,32)")
    w.add_argument(
        "--workload", choices=("fleet", "edit"), default="fleet",
        help="fleet: the shared system prompt and exactly --max-tokens per turn (default); "
        "edit: each agent's own --file-tokens slice of a Python standard-library module (seeded "
        "pick), returned whole with one rename or docstring; a reply ends at EOS, capped at 5/4 "
        "of the file + 64 tokens (--max-tokens, --min-tokens and --system-tokens unused)",
    )  # fmt: skip
    w.add_argument(
        "--file-tokens", type=int, default=3000, help="edit: each file's tokens (default 3000)"
    )
    w.add_argument(
        "--turns", type=int, default=None,
        help="turns per agent (default 4; edit: 1, each later turn asks one more change)",
    )  # fmt: skip
    w.add_argument("--max-tokens", type=int, default=256, help="tokens per turn (default 256)")
    w.add_argument(
        "--min-tokens",
        type=int,
        default=None,
        help="draw each reply's length from [MIN, --max-tokens] (seeded; the same on both "
        "servers), so rows end at different steps as real agents' do (default: all --max-tokens)",
    )
    w.add_argument(
        "--system-tokens", type=int, default=3600, help="shared system prompt length (3600)"
    )
    w.add_argument("--rounds", type=int, default=1, help="runs per N, each with its own prompts")
    w.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="N",
        help="first an untimed fleet of N agents x 2 short turns on each server (MLX-CUDA "
        "compiles kernels and cuDNN graphs on first use); 0: none",
    )
    w.add_argument("--seed", type=int, default=0, help="seed of the prompt words")
    w.add_argument(
        "--temperature", type=float, default=0.0,
        help="every request's temperature (default 0: greedy); > 0 gives each agent its own "
        "sampler on both servers, the per-row sampling case",
    )  # fmt: skip
    w.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (default 1)")
    v = s.add_argument_group("servers")
    v.add_argument("--batch", type=int, default=None, help="mlxd --batch (default: max N)")
    v.add_argument("--mlxd-args", default="", help="extra flags for mlxd serve, one string")
    v.add_argument("--mlx-lm-args", default="", help="extra flags for mlx_lm.server, one string")
    v.add_argument(
        "--mlxd-variant", type=parse_variant, action="append", default=None,
        metavar="NAME=FLAGS",
        help="one more mlxd server, side mlxd-NAME, with FLAGS after --mlxd-args (repeatable), "
        "e.g. spec='--speculative ngram --num-speculative-tokens 4': the run compares "
        "mlx_lm.server, mlxd and mlxd-spec, each variant also against plain mlxd, with "
        "speculation's acceptance rate and accepted tokens per request",
    )  # fmt: skip
    v.add_argument(
        "--adapters", type=parse_adapters, default=None, metavar="PATH[,PATH...]",
        help="LoRA adapter folders: agent i uses adapter i %% K, mlxd serving them all "
        "(--lora-modules lora0=PATH0 ..., a request's model naming one), mlx_lm.server with "
        "its per-request `adapters` path (it reloads the model at each switch); side mlxd-base "
        "runs the same agents without an adapter, for mlxd/mlxd-base",
    )  # fmt: skip
    v.add_argument(
        "--make-adapters", type=int, default=None, metavar="K",
        help="as --adapters, with K random LoRA adapters made for --model (mlx-lm's format, "
        "written beside the server logs)",
    )  # fmt: skip
    v.add_argument(
        "--only", choices=("mlxd", "mlx-lm"), default=None,
        help="run one server: mlxd (with its variants) or mlx-lm",
    )  # fmt: skip
    v.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to ready")
    v.add_argument(
        "--interleave", action="store_true",
        help="both servers up at once (the model loaded twice), each round run on each in turn, "
        "the order swapped every round: round r of each server minutes apart, for the "
        "round-by-round ratios (default: one server after the other)",
    )  # fmt: skip
    v.add_argument(
        "--cache-limit-gb", type=float, default=None, metavar="GB",
        help="cap MLX's buffer cache in both servers' processes (mx.set_cache_limit): each MLX "
        "process otherwise keeps freed buffers up to 95%% of the device, so two servers on one "
        "GPU (--interleave) starve each other (default: MLX's own limit)",
    )  # fmt: skip
    v.add_argument(
        "--baseline", action="store_true",
        help="before each 1-agent round, mlx-lm's generate_step alone on a first-turn-sized "
        "prompt (python -m mlxd.bench.raw_step): the 1-agent ITL is reported against it, "
        "pooled and round by round; mlxd's engine alone (no server) alternates with it",
    )  # fmt: skip
    j = s.add_argument_group("a background job (one mlxd server, no mlx_lm.server)")
    j.add_argument(
        "--during-job", choices=("fine_tune",), default=None,
        help="each round runs the agents twice on one mlxd server: alone, and while a "
        "background LoRA job trains on the served model (started and seen training before the "
        "agents, cancelled with force after; a round where it was not running throughout is "
        "marked invalid): ITL p99 / p50, TTFT p99, tok/s and their ratios job/none per round, "
        "and the job's training steps/s",
    )  # fmt: skip
    j.add_argument(
        "--job-hyperparameters", default=None, metavar="JSON",
        help="with --during-job: the job's method.supervised.hyperparameters over the bench's "
        "(iters 1000000, batch_size 4, max_seq_length 512, ...), e.g. '{\"num_layers\": 8}'",
    )  # fmt: skip
    o = s.add_argument_group("output")
    o.add_argument("--json", default=None, metavar="OUT", help="every raw number")
    o.add_argument("--markdown", default=None, metavar="OUT.md", help="the table")
    o.add_argument("--plot", default=None, metavar="OUT.png", help="tok/s and TTFT against N")
    o.add_argument("--log-dir", default=None, help="server logs (default: a temporary folder)")


def run_serve_cmd(args: argparse.Namespace) -> None:
    if args.turns is None:
        args.turns = 1 if args.workload == "edit" else 4
    if args.file_tokens < 64:
        sys.exit("mlxd bench serve: --file-tokens must be >= 64")
    if args.workload == "edit" and args.min_tokens is not None:
        sys.exit("mlxd bench serve: --min-tokens is for the fleet workload (edit ends at EOS)")
    names = [name for name, _ in args.mlxd_variant or []]
    if len(set(names)) < len(names):
        sys.exit(f"mlxd bench serve: --mlxd-variant names repeat: {names}")
    if args.adapters and args.make_adapters is not None:
        sys.exit("mlxd bench serve: --adapters and --make-adapters do not combine")
    if args.make_adapters is not None and args.make_adapters < 1:
        sys.exit("mlxd bench serve: --make-adapters must be >= 1")
    if (args.adapters or args.make_adapters) and "base" in names:
        sys.exit("mlxd bench serve: --mlxd-variant base: the name of the adapters' base side")
    if args.turns < 1 or args.max_tokens < 1 or args.system_tokens < 1 or args.rounds < 1:
        sys.exit("mlxd bench serve: --turns, --max-tokens, --system-tokens, --rounds must be >= 1")
    if args.min_tokens is not None and not 1 <= args.min_tokens <= args.max_tokens:
        sys.exit("mlxd bench serve: --min-tokens must be between 1 and --max-tokens")
    if args.plot:
        require("matplotlib", "matplotlib>=3.8,<4", "--plot", "bench serve")
    args.batch_given = args.batch is not None
    if args.batch is None:
        args.batch = max(args.agents)  # equal caps up to mlx_lm.server's 32
    if args.during_job or args.job_hyperparameters:
        return _run_during_job(args)
    from ..bench.serve import run_serve

    if code := run_serve(args):
        sys.exit(code)


def _run_during_job(args: argparse.Namespace) -> None:
    if args.during_job is None:
        sys.exit("mlxd bench serve: --job-hyperparameters needs --during-job")
    others = {"--workload edit": args.workload == "edit", "--only mlx-lm": args.only == "mlx-lm",
              "--mlxd-variant": bool(args.mlxd_variant), "--interleave": args.interleave,
              "--adapters": bool(args.adapters or args.make_adapters), "--plot": bool(args.plot),
              "--baseline": args.baseline}  # fmt: skip
    if clash := [flag for flag, on in others.items() if on]:
        sys.exit(f"mlxd bench serve: --during-job runs one mlxd server: not with {clash[0]}")
    if args.job_hyperparameters:
        try:
            ok = isinstance(json.loads(args.job_hyperparameters), dict)
        except ValueError:
            ok = False
        if not ok:
            sys.exit("mlxd bench serve: --job-hyperparameters must be a JSON object")
    from ..bench.during_job import run_during_job

    if code := run_during_job(args):
        sys.exit(code)
