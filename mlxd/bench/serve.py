"""`mlxd bench serve`: the agent-fleet benchmark of the mlxd server against mlx_lm.server.

Each side runs as its own subprocess, one after the other (never both at once): one server per
side per run, every N (and every round) against that same warm server, with a system prompt of
its own so that no prompt cache carries over from one N to the next."""

import asyncio
import json
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .baseline import baseline_line, pooled_baseline, run_baseline
from .fleet import Workload, aggregate, banned_tokens, build_workload, run_fleet
from .plot import SERVE_METRICS, markdown, plot
from .report import spread
from .servers import LABEL, SIDES, RSSSampler, Server, command, free_port, lifetime_peak_rss_bytes

MLX_LM_DEFAULT_CAP = 32  # mlx_lm.server's --decode-concurrency default


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


def mlx_lm_cap(extra: list[str]) -> int:
    for i, flag in enumerate(extra):
        if flag.startswith("--decode-concurrency"):
            return int(flag.split("=", 1)[1] if "=" in flag else extra[i + 1])
    return MLX_LM_DEFAULT_CAP


def bench_command(args: Any, model: Path) -> str:
    """The command line that reproduces this run (outputs left out)."""
    parts = ["mlxd bench serve", f"--model {model}", f"--agents {','.join(map(str, args.agents))}"]
    parts += [f"--turns {args.turns}", f"--max-tokens {args.max_tokens}"]
    parts += [f"--system-tokens {args.system_tokens}", f"--rounds {args.rounds}"]
    parts += [f"--batch {args.batch}"] if args.batch_given else []
    parts += [f"--seed {args.seed}"] if args.seed else []
    parts += [f"--warmup {args.warmup}"] if getattr(args, "warmup", 0) else []
    parts += [f"--temperature {args.temperature}"] if getattr(args, "temperature", 0.0) else []
    parts += [f"--top-p {args.top_p}"] if getattr(args, "top_p", 1.0) != 1.0 else []
    parts += [f"--only {args.only}"] if args.only else []
    parts += ["--baseline"] if getattr(args, "baseline", False) else []
    for flag, value in (("--mlxd-args", args.mlxd_args), ("--mlx-lm-args", args.mlx_lm_args)):
        parts += [f"{flag} {shlex.quote(value)}"] if value else []
    return " ".join(parts)


def run_side(
    side: str,
    args: Any,
    model: Path,
    wls: dict[tuple[Any, int], Workload],
    log_dir: Path,
    bound: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One server for every N and round; `bound`, if given, runs (and is kept) just before each
    one-agent round, while the server idles (bench/baseline.py)."""
    extra = shlex.split(args.mlxd_args if side == "mlxd" else args.mlx_lm_args)
    cap = args.batch if side == "mlxd" else mlx_lm_cap(extra)
    data = log_dir / "mlxd-data"
    cmd = command(side, str(model), free_port(), args.batch, extra, data)
    port = int(cmd[cmd.index("--port") + 1])
    out: dict[str, Any] = {"command": cmd, "cap": cap, "runs": {}}
    if max(args.agents) > cap:
        print(f"note: N > {LABEL[side]}'s cap of {cap} rows: requests wait", file=sys.stderr)
    with Server(side, cmd, port, log_dir) as srv:
        out["log"] = str(srv.log_path)
        out["ready_s"] = srv.wait_ready(args.startup_timeout)
        assert srv.proc is not None
        sampler = RSSSampler(srv.proc.pid)
        sampler.start()
        out["idle_rss_gb"] = sampler.current / 1e9
        try:
            if (w := wls.get(("warmup", 0))) is not None:  # untimed: JIT kernels, cuDNN graphs
                out["warmup"] = run_one(srv, sampler, w, -1)["figures"]
            for n in args.agents:
                out["runs"][str(n)] = []
                for r in range(args.rounds):
                    if bound is not None and n == 1:
                        out.setdefault("baseline", []).append(bound())
                    out["runs"][str(n)].append(run_one(srv, sampler, wls[n, r], r))
            hwm = lifetime_peak_rss_bytes(srv.proc.pid)
            out["lifetime_peak_rss_gb"] = None if hwm is None else hwm / 1e9
        finally:
            sampler.stop()
    return out


def run_one(srv: Server, sampler: RSSSampler, wl: Workload, r: int) -> dict[str, Any]:
    sampler.reset()
    before = srv.metrics()
    records, wall = asyncio.run(run_fleet(srv.url, wl, timeout_s=3600.0))
    fig = aggregate(records, wall, wl.max_tokens) | {"peak_rss_gb": sampler.peak / 1e9}
    after = srv.metrics()
    waits = engine_waits(before, after)
    split = "".join(f", {k} mean {v:.3f} s" for k, v in (waits or {}).items())
    print(
        f"[{LABEL[srv.side]}] N={wl.agents} round {r}: {fig['output_tokens']} tokens in "
        f"{wall:.2f} s = {fig['output_tok_s']:.1f} tok/s, TTFT p50 {fig['ttft_p50_s'] or 0:.3f} s,"
        f" peak RSS {fig['peak_rss_gb']:.3f} GB, errors {fig['errors']}{split}",
        file=sys.stderr,
        flush=True,
    )
    out = {"figures": fig, "server_metrics": after, "requests": records}
    return out | ({"engine_waits": waits} if waits else {})


def engine_waits(before: dict | None, after: dict | None) -> dict[str, float] | None:
    """Mean queue and prefill time per row over one run, from mlxd's /metrics totals (the
    engine's split of TTFT); None for a server without them."""
    if before is None or after is None:
        return None
    out = {}
    for part in ("queue", "prefill"):
        total = count = 0.0
        for name, v in after.items():
            if name.startswith(f"mlxd_request_{part}_seconds_"):
                d = v - before.get(name, 0.0)
                total += d if "_sum{" in name else 0.0
                count += d if "_count{" in name else 0.0
        if count:
            out[part] = total / count
    return out or None


def summarize(result: dict[str, Any], ns: list[int]) -> dict[str, Any]:
    """Per N and side: each metric's median [min-max] over rounds; ratio of medians."""
    out: dict[str, Any] = {}
    for n in ns:
        per: dict[str, Any] = {"ratio": {}}
        for side, data in result["sides"].items():
            figs = [run["figures"] for run in data["runs"][str(n)]]
            per[side] = {"requests": sum(f["requests"] for f in figs) // len(figs)}
            per[side]["output_tokens"] = sum(f["output_tokens"] for f in figs) // len(figs)
            for key, *_ in SERVE_METRICS:
                vals = [f[key] for f in figs if f[key] is not None]
                per[side][key] = spread(vals) if vals else None
        if all(s in per for s in SIDES):
            for key, *_ in SERVE_METRICS:
                a, b = per["mlxd"][key], per["mlx_lm"][key]
                if a and b and b["median"] > 0:
                    per["ratio"][key] = a["median"] / b["median"]
        out[str(n)] = per
    return out


def run_serve(args: Any) -> int:
    """Run every side, write JSON / markdown / PNG, print the table; 1 on any failed request."""
    from .generate import environment

    model = resolve_model(args.model)
    tok, eos = load_tokenizer(model)
    banned = banned_tokens(model, eos)
    shape = (args.turns, args.max_tokens, args.system_tokens)
    sampling = (getattr(args, "temperature", 0.0), getattr(args, "top_p", 1.0))
    wls = {
        (n, r): build_workload(tok, n, *shape, f"{args.seed}:n{n}:r{r}", banned, *sampling)
        for n in args.agents
        for r in range(args.rounds)
    }
    if getattr(args, "warmup", 0):
        warm = build_workload(
            tok, args.warmup, 2, 32, args.system_tokens, f"{args.seed}:w", banned, *sampling
        )
        wls["warmup", 0] = warm
    sides = [s for s in SIDES if args.only in (None, LABEL[s])]
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mlxd-bench-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
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
    bound = (lambda: run_baseline(args, model)) if getattr(args, "baseline", False) else None
    for side in sides:
        result["sides"][side] = run_side(side, args, model, wls, log_dir, bound)
        save_json(result, args)
    if bound is not None:
        runs = [b for data in result["sides"].values() for b in data.get("baseline", [])]
        result["baseline"] = pooled_baseline(runs)
    result["summary"] = summarize(result, args.agents)
    save_json(result, args)
    table = markdown(result) + baseline_line(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.plot:
        plot(result, args.plot)
    print(table, flush=True)
    return _verdict(result)


def save_json(result: dict[str, Any], args: Any) -> None:
    # After every side, so a run killed at a time limit keeps what it measured.
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


def _verdict(result: dict[str, Any]) -> int:
    figs = [
        run["figures"]
        for data in result["sides"].values()
        for runs in data["runs"].values()
        for run in runs
    ]
    if errors := sum(f["errors"] for f in figs):
        print(f"mlxd bench serve: {errors} requests failed (see the JSON)", file=sys.stderr)
        return 1
    if short := sum(f["short_replies"] for f in figs):
        print(f"warning: {short} replies stopped before --max-tokens", file=sys.stderr)
    return 0
