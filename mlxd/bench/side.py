"""One side of `mlxd bench serve`: its server up (warmed once), then timed rounds on demand.
The sides either run one after the other (`run_side`) or both up at once, round by round
(`--interleave`, serve.py), so that round r of each server is measured minutes apart at most."""

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fleet import Workload, aggregate, run_fleet
from .lora import agent_fields
from .servers import RSSSampler, Server, command, free_port, lifetime_peak_rss_bytes
from .variants import kind, label, server_flags

MLX_LM_DEFAULT_CAP = 32  # mlx_lm.server's --decode-concurrency default


def mlx_lm_cap(extra: list[str]) -> int:
    for i, flag in enumerate(extra):
        if flag.startswith("--decode-concurrency"):
            return int(flag.split("=", 1)[1] if "=" in flag else extra[i + 1])
    return MLX_LM_DEFAULT_CAP


@dataclass(frozen=True)
class Plan:
    """What every side of one run shares: the flags, the model, each (N, round)'s workload, the
    log folder, and `bound`, run (and kept) just before each one-agent round (baseline.py)."""

    args: Any
    model: Path
    wls: dict[tuple[Any, int], Workload]
    log_dir: Path
    bound: Callable[[], dict[str, Any]] | None = None


class ServedSide:
    """A server for every N and round of one side; `out` collects what bench serve saves."""

    def __init__(self, side: str, plan: Plan) -> None:
        args, model, log_dir = plan.args, plan.model, plan.log_dir
        self.side, self.args, self.wls, self.bound = side, args, plan.wls, plan.bound
        self.model = model
        extra = server_flags(args, side)
        cap = args.batch if kind(side) == "mlxd" else mlx_lm_cap(extra)
        cap_gb = getattr(args, "cache_limit_gb", None)
        limit = None if cap_gb is None else int(cap_gb * 1e9)
        data = log_dir / f"{side}-data"  # each mlxd its own store: two may run at once
        cmd = command(side, str(model), free_port(), args.batch, extra, data, limit)
        self.out: dict[str, Any] = {"command": cmd, "flags": extra, "cap": cap, "runs": {}}
        if max(args.agents) > cap:
            print(f"note: N > {label(side)}'s cap of {cap} rows: requests wait", file=sys.stderr)
        self.srv = Server(side, cmd, int(cmd[cmd.index("--port") + 1]), log_dir)

    def __enter__(self) -> "ServedSide":
        self.srv.__enter__()
        try:
            self.out["log"] = str(self.srv.log_path)
            self.out["ready_s"] = self.srv.wait_ready(self.args.startup_timeout)
            assert self.srv.proc is not None
            self.sampler = RSSSampler(self.srv.proc.pid)
            self.sampler.start()
            self.out["idle_rss_gb"] = self.sampler.current / 1e9
            if (w := self.wls.get(("warmup", 0))) is not None:  # untimed: JIT kernels, cuDNN
                fields = agent_fields(self.args, self.side, self.model, w.agents)
                self.out["warmup"] = run_one(self.srv, self.sampler, w, -1, fields)["figures"]
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def round(self, n: int, r: int) -> None:
        """Round r of N agents (its generate_step bound first where N is 1)."""
        if self.bound is not None and n == 1:
            b = self.bound()
            self.out.setdefault("baseline", []).append(b)
            # Printed now: a run killed at a time limit keeps each round's bound in its log.
            ok = "itl_p50_ms" in b
            got = f"ITL p50 {b['itl_p50_ms']:.2f} ms" if ok else f"failed: {b.get('reason')}"
            if ok and "engine" in b:
                got += f" (mlxd's engine alone {b['engine']['itl_p50_ms']:.2f} ms)"
            print(f"[generate_step] before round {r}: {got}", file=sys.stderr, flush=True)
        fields = agent_fields(self.args, self.side, self.model, n)
        run = run_one(self.srv, self.sampler, self.wls[n, r], r, fields)
        self.out["runs"].setdefault(str(n), []).append(run)

    def __exit__(self, *exc: Any) -> None:
        try:
            if getattr(self, "sampler", None) is not None:
                self.sampler.stop()
                hwm = lifetime_peak_rss_bytes(self.srv.proc.pid) if self.srv.proc else None
                self.out["lifetime_peak_rss_gb"] = None if hwm is None else hwm / 1e9
        finally:
            self.srv.__exit__(*exc)


def run_one(
    srv: Server, sampler: RSSSampler, wl: Workload, r: int, fields: list[dict] | None = None
) -> dict[str, Any]:
    sampler.reset()
    before = srv.metrics()
    records, wall = asyncio.run(run_fleet(srv.url, wl, 3600.0, fields))
    fig = aggregate(records, wall, wl.max_tokens) | {"peak_rss_gb": sampler.peak / 1e9}
    after = srv.metrics()
    waits = engine_waits(before, after)
    split = "".join(f", {k} mean {v:.3f} s" for k, v in (waits or {}).items())
    gone = srv.exit_code() if fig["errors"] else None  # e.g. -11: a native crash cut every stream
    if gone is not None:
        split += f", server exited with code {gone}"
    if fig["accepted_tokens"] is not None:
        acc, rate = fig["accepted_tokens"], fig["acceptance_rate"]
        split += f", accepted {acc} of {acc + fig['rejected_tokens']} drafted"
        split += f" ({rate:.3f})" if rate is not None else ""
    print(
        f"[{label(srv.side)}] N={wl.agents} round {r}: {fig['output_tokens']} tokens in "
        f"{wall:.2f} s = {fig['output_tok_s']:.1f} tok/s, TTFT p50 {fig['ttft_p50_s'] or 0:.3f} s,"
        f" ITL p50 {fig['itl_p50_ms'] or 0:.2f} ms, peak RSS {fig['peak_rss_gb']:.3f} GB,"
        f" errors {fig['errors']}{split}",
        file=sys.stderr,
        flush=True,
    )
    out = {"figures": fig, "server_metrics": after, "requests": records}
    if fig["errors"]:  # the server's own account of what failed travels with the run
        out["log_tail"] = srv.log_tail(60)
        out["first_traceback"] = srv.first_traceback()
        out["server_exit"] = gone
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
