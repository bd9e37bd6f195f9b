"""`mlxd bench serve`: the agent-fleet benchmark of the mlxd server against mlx_lm.server.

Each side runs as its own subprocess: one server per side per run, every N (and every round)
against that same warm server, with a system prompt of its own so that no prompt cache carries
over from one N to the next. The sides run one after the other, or with `--interleave` both up
at once, round by round (side.py)."""

import contextlib
import json
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .accept import ACCEPT_METRICS, same_replies
from .baseline import baseline_line, pooled_baseline, run_baseline
from .edit import build_edit_workload
from .fleet import Workload, banned_tokens, build_workload
from .plot import SERVE_METRICS, markdown, plot
from .report import spread
from .rounds import rounds_line
from .side import Plan, ServedSide
from .variants import ratio_pairs, run_sides


def resolve_model(ref: str | None) -> Path:
    if ref is None:
        from ..model.default import default_model_path

        return default_model_path()
    path = Path(ref).expanduser()
    if not (path / "config.json").exists():
        sys.exit(f"mlxd bench serve: --model must be a local MLX model folder: {ref}")
    return path.resolve()


def load_tokenizer(model: Path) -> tuple[Any, list[int]]:
    """mlx-lm's tokenizer and EOS set, as mlx_lm.server loads them (config + generation_config)."""
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    eos = load_config(model).get("eos_token_id")
    tok = mlx_lm_load_tokenizer(model, eos_token_ids=[eos] if isinstance(eos, int) else eos)
    return tok, sorted(tok.eos_token_ids)


def bench_command(args: Any, model: Path) -> str:
    """The command line that reproduces this run (outputs left out)."""
    parts = ["mlxd bench serve", f"--model {model}", f"--agents {','.join(map(str, args.agents))}"]
    if getattr(args, "workload", "fleet") == "edit":
        parts += ["--workload edit", f"--file-tokens {args.file_tokens}"]
    parts += [f"--turns {args.turns}", f"--max-tokens {args.max_tokens}"]
    parts += [f"--min-tokens {args.min_tokens}"] if getattr(args, "min_tokens", None) else []
    parts += [f"--system-tokens {args.system_tokens}", f"--rounds {args.rounds}"]
    parts += [f"--batch {args.batch}"] if args.batch_given else []
    parts += [f"--seed {args.seed}"] if args.seed else []
    parts += [f"--warmup {args.warmup}"] if getattr(args, "warmup", 0) else []
    parts += [f"--temperature {args.temperature}"] if getattr(args, "temperature", 0.0) else []
    parts += [f"--top-p {args.top_p}"] if getattr(args, "top_p", 1.0) != 1.0 else []
    parts += [f"--only {args.only}"] if args.only else []
    parts += ["--baseline"] if getattr(args, "baseline", False) else []
    parts += ["--interleave"] if getattr(args, "interleave", False) else []
    if (cap := getattr(args, "cache_limit_gb", None)) is not None:
        parts += [f"--cache-limit-gb {cap:g}"]
    for flag, value in (("--mlxd-args", args.mlxd_args), ("--mlx-lm-args", args.mlx_lm_args)):
        parts += [f"{flag} {shlex.quote(value)}"] if value else []
    if k := getattr(args, "make_adapters", None):
        parts += [f"--make-adapters {k}"]
    elif paths := getattr(args, "adapters", None):
        parts += [f"--adapters {shlex.quote(','.join(paths))}"]
    for name, flags in getattr(args, "mlxd_variant", None) or []:
        parts += [f"--mlxd-variant {shlex.quote(f'{name}={flags}')}"]
    return " ".join(parts)


def run_side(side: str, plan: Plan) -> dict[str, Any]:
    """One server for every N and round (the bound, if any, while the server idles)."""
    with ServedSide(side, plan) as s:
        for n in plan.args.agents:
            for r in range(plan.args.rounds):
                s.round(n, r)
    return s.out


def run_interleaved(
    sides: list[str], plan: Plan, saved: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Both servers up at once, each round on each in turn, the order swapped every round
    (mlx_lm.server first in even rounds) so neither always runs in the other's wake; `saved`
    gets the sides so far after every round (a run killed at a time limit keeps them)."""
    with contextlib.ExitStack() as stack:
        # One at a time: each server's port is picked as it starts.
        served = [stack.enter_context(ServedSide(side, plan)) for side in sides]
        for n in plan.args.agents:
            for r in range(plan.args.rounds):
                for s in served if r % 2 == 0 else served[::-1]:
                    s.round(n, r)
                saved({s.side: s.out for s in served})
    return {s.side: s.out for s in served}


def summarize(result: dict[str, Any], ns: list[int]) -> dict[str, Any]:
    """Per N and side: each metric's median [min-max] over rounds; per compared pair of sides
    (`ratios`, "mlxd/mlx_lm" also as `ratio`): the ratio of medians."""
    out: dict[str, Any] = {}
    keys = [m[0] for m in SERVE_METRICS] + [m[0] for m in ACCEPT_METRICS]
    for n in ns:
        per: dict[str, Any] = {}
        for side, data in result["sides"].items():
            figs = [run["figures"] for run in data["runs"][str(n)]]
            per[side] = {"requests": sum(f["requests"] for f in figs) // len(figs)}
            per[side]["output_tokens"] = sum(f["output_tokens"] for f in figs) // len(figs)
            for key in keys:
                vals = [f[key] for f in figs if f.get(key) is not None]
                per[side][key] = spread(vals) if vals else None
        per["ratios"] = {
            f"{a}/{b}": _ratio(per[a], per[b]) for a, b in ratio_pairs(list(result["sides"]))
        }
        per["ratio"] = per["ratios"].get("mlxd/mlx_lm", {})
        out[str(n)] = per
    return out


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, *_ in SERVE_METRICS:
        x, y = a[key], b[key]
        if x and y and y["median"] > 0:
            out[key] = x["median"] / y["median"]
    return out


def build_workloads(args: Any, tok: Any, banned: list[int]) -> dict[tuple[Any, int], Workload]:
    """Each (N, round)'s workload (its own prompts), and the warm-up's under ("warmup", 0)."""
    sampling = (getattr(args, "temperature", 0.0), getattr(args, "top_p", 1.0))
    shape = (args.turns, args.max_tokens, args.system_tokens)
    edit = getattr(args, "workload", "fleet") == "edit"
    wls: dict[tuple[Any, int], Workload] = {}
    for n in args.agents:
        for r in range(args.rounds):
            seed = f"{args.seed}:n{n}:r{r}"
            if edit:
                wls[n, r] = build_edit_workload(
                    tok, n, args.turns, args.file_tokens, seed, *sampling
                )
            else:
                mt = getattr(args, "min_tokens", None)
                wls[n, r] = build_workload(tok, n, *shape, seed, banned, *sampling, min_tokens=mt)
    if getattr(args, "warmup", 0):  # short fleet turns: kernels compiled, whatever the workload
        wls["warmup", 0] = build_workload(
            tok, args.warmup, 2, 32, args.system_tokens, f"{args.seed}:w", banned, *sampling
        )
    return wls


def run_serve(args: Any) -> int:
    """Run every side, write JSON / markdown / PNG, print the table; 1 on any failed request."""
    from .generate import environment

    model = resolve_model(args.model)
    tok, eos = load_tokenizer(model)
    banned = banned_tokens(model, eos)
    wls = build_workloads(args, tok, banned)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mlxd-bench-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if k := getattr(args, "make_adapters", None):  # kept with the logs, which name them
        from .random_adapters import make_adapters

        args.adapters = make_adapters(model, k, log_dir / "adapters")
    sides = run_sides(args)
    result: dict[str, Any] = {
        "command": bench_command(args, model),
        "env": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "model": {"name": model.name, "path": str(model), "system_tokens": args.system_tokens},
        "eos_ids": eos,
        "banned_token_ids": banned,
        "log_dir": str(log_dir),
        "sides": {},
    }
    if sources := {f"{n}:{r}": w.sources for (n, r), w in wls.items() if w.sources}:
        result["workload"] = {"kind": "edit", "sources": sources}  # each agent's file and edits
    bound = (lambda: run_baseline(args, model)) if getattr(args, "baseline", False) else None
    plan = Plan(args, model, wls, log_dir, bound)
    if getattr(args, "interleave", False) and len(sides) > 1:
        result["interleaved"] = True
        result["sides"] = run_interleaved(sides, plan, lambda so: save_json(result, args, so))
    for side in [] if result.get("interleaved") else sides:
        result["sides"][side] = run_side(side, plan)
        save_json(result, args)
    if bound is not None:
        runs = [b for data in result["sides"].values() for b in data.get("baseline", [])]
        result["baseline"] = pooled_baseline(runs)
    result["summary"] = summarize(result, args.agents)
    if same := same_replies(result):
        result["same_replies"] = same
    save_json(result, args)
    table = markdown(result) + rounds_line(result, args.agents) + baseline_line(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.plot:
        plot(result, args.plot)
    print(table, flush=True)
    return _verdict(result, getattr(args, "workload", "fleet"))


def save_json(result: dict[str, Any], args: Any, sides: dict[str, Any] | None = None) -> None:
    # After every side (or interleaved round), so a run killed at a time limit keeps what it
    # measured; `sides`: the interleaved sides so far.
    if args.json:
        out = result if sides is None else result | {"sides": sides}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


def _verdict(result: dict[str, Any], workload: str = "fleet") -> int:
    figs = [
        run["figures"]
        for data in result["sides"].values()
        for runs in data["runs"].values()
        for run in runs
    ]
    if errors := sum(f["errors"] for f in figs):
        print(f"mlxd bench serve: {errors} requests failed (see the JSON)", file=sys.stderr)
        return 1
    # An edit reply ends at EOS, before its cap: only the fleet's replies are all --max-tokens.
    if workload == "fleet" and (short := sum(f["short_replies"] for f in figs)):
        print(f"warning: {short} replies stopped before --max-tokens", file=sys.stderr)
    return 0
