"""`mlxd bench prefix`: what the prefix store saves, as ratios measured side by side in one run.

1. agents: on one server, agent A's cold TTFT vs agent B's with A's system prompt stored.
2. restart: a prompt's TTFT restored from --ssd-cache after a restart vs a plain re-prefill.
3. fleet: `bench serve`'s agent fleet (mlxd only) with the store on and off.
Every round gets a system prompt of its own, so no round is served by an earlier one's entries."""

import asyncio
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .fleet import Workload, banned_tokens, build_workload, stream_chat
from .prefix_report import markdown, summarize
from .serve import load_tokenizer, resolve_model, run_side, save_json
from .servers import Server, command, free_port
from .side import Plan

SECTIONS = ("agents", "restart", "fleet")


class Bench:
    """The run's model, tokenizer and flags, and the servers it starts (one log each)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.model = resolve_model(args.model)
        self.tok, self.eos = load_tokenizer(self.model)
        self.banned = banned_tokens(self.model, self.eos)
        self.log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mlxd-bench-prefix-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.extra = shlex.split(args.mlxd_args)

    def workload(self, agents: int, turns: int, name: str) -> Workload:
        a = self.args
        seed = f"{a.seed}:{name}"  # per section and round: a system prompt of its own
        return build_workload(
            self.tok, agents, turns, a.max_tokens, a.prefix_tokens, seed, self.banned
        )

    def server(self, name: str, flags: list[str]) -> Server:
        """An mlxd server (not started) whose log is `<log dir>/<name>/mlxd.log`."""
        folder = self.log_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        cmd = command("mlxd", str(self.model), port, 1, [*self.extra, *flags], folder / "data")
        return Server("mlxd", cmd, port, folder)

    def wait(self, srv: Server) -> float:
        return srv.wait_ready(self.args.startup_timeout)


def request(srv: Server, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat request, alone on the server; its record without the per-chunk times."""

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=httpx.Timeout(3600.0)) as c:
            return await stream_chat(c, body)

    rec = asyncio.run(go())
    rec.pop("chunk_s")
    rec["reply"] = rec.pop("text")
    return rec


def stop_gracefully(srv: Server, sig: signal.Signals, timeout_s: float = 120.0) -> dict:
    """Stop with `sig` as an operator would, and say how it ended: with SIGINT mlxd serve runs
    ModelProvider.close() (flushing the disk queue); a kill after the timeout is recorded."""
    assert srv.proc is not None
    t0 = time.perf_counter()
    srv.proc.send_signal(sig)
    killed = False
    try:
        srv.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = True
        srv.proc.kill()
        srv.proc.wait()
    return {
        "signal": sig.name,
        "exit_code": srv.proc.returncode,
        "stop_s": time.perf_counter() - t0,
        "killed_after_timeout": killed,
    }


def disk_entries(root: Path) -> dict[str, int]:
    """Entry files (temp files left out) and their bytes under the SSD tier's folder."""
    files = [p for p in root.rglob("*") if p.is_file() and "quarantine" not in p.parts]
    files = [p for p in files if not p.name.endswith(".tmp")]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def run_agents(b: Bench) -> dict[str, Any]:
    """Section 1: per round, A then B on one server (default store), each alone."""
    with b.server("agents", []) as srv:
        out: dict[str, Any] = {"command": srv.cmd, "log": str(srv.log_path), "rounds": []}
        out["ready_s"] = b.wait(srv)
        for r in range(b.args.rounds):
            wl = b.workload(2, 1, f"agents:r{r}")
            system = {"role": "system", "content": wl.system}
            a, bb = (
                request(srv, wl.body([system, {"role": "user", "content": task}]))
                for task in wl.tasks
            )
            out["rounds"].append({"a": a, "b": bb})
            _say(f"agents round {r}: A TTFT {_s(a)} cached {a['cached_tokens']}, "
                 f"B TTFT {_s(bb)} cached {bb['cached_tokens']}")  # fmt: skip
    return out


def run_restart(b: Bench) -> dict[str, Any]:
    """Section 2: per round, a turn on server 1 (--ssd-cache DIR), a graceful stop, the same
    request on server 2 (same DIR); then on a server without the disk tier, fresh per round."""
    sig = signal.Signals[f"SIG{b.args.stop_signal}"]
    out: dict[str, Any] = {"rounds": []}
    for r in range(b.args.rounds):
        wl = b.workload(1, 1, f"restart:r{r}")
        msgs = [{"role": "system", "content": wl.system}, {"role": "user", "content": wl.tasks[0]}]
        body = wl.body(msgs)
        ssd = b.log_dir / f"restart-r{r}" / "ssd"
        flags = ["--ssd-cache", str(ssd)]
        rnd: dict[str, Any] = {"ssd_dir": str(ssd)}
        with b.server(f"restart-r{r}/first", flags) as s1:
            rnd["first_ready_s"] = b.wait(s1)
            rnd["first"] = request(s1, body)
            rnd["disk_before_stop"] = disk_entries(ssd)
            rnd["stop"] = stop_gracefully(s1, sig)
        rnd["disk_after_stop"] = disk_entries(ssd)
        with b.server(f"restart-r{r}/second", flags) as s2:
            rnd["second_ready_s"] = b.wait(s2)
            rnd["restored"] = request(s2, body)
        # The re-prefill: no disk tier and an empty store; RAM store on as by default.
        with b.server(f"restart-r{r}/plain", []) as s3:
            rnd["plain_ready_s"] = b.wait(s3)
            rnd["reprefill"] = request(s3, body)
        out["rounds"].append(rnd)
        _say(f"restart round {r}: restored TTFT {_s(rnd['restored'])} cached "
             f"{rnd['restored']['cached_tokens']} of {rnd['restored']['prompt_tokens']}, "
             f"re-prefill TTFT {_s(rnd['reprefill'])}; stop {rnd['stop']}")  # fmt: skip
    return out


def run_fleets(b: Bench) -> dict[str, Any]:
    """Section 3: bench serve's fleet on mlxd, default flags vs --prompt-cache-size 0; the
    same prompts for both, a fresh server for each."""
    a = b.args
    wls = {
        (n, r): build_workload(
            b.tok,
            n,
            a.turns,
            a.fleet_max_tokens,
            a.prefix_tokens,
            f"{a.seed}:fleet:n{n}:r{r}",
            b.banned,
        )
        for n in a.agents
        for r in range(a.fleet_rounds)
    }
    out: dict[str, Any] = {}
    for mode, flags in (("on", ""), ("off", "--prompt-cache-size 0")):
        side_args = _FleetArgs(a, f"{a.mlxd_args} {flags}".strip())
        folder = b.log_dir / f"fleet-{mode}"
        folder.mkdir(parents=True, exist_ok=True)
        out[mode] = run_side("mlxd", Plan(side_args, b.model, wls, folder))
    return out


class _FleetArgs:
    """The few flags `serve.run_side` reads, for one store mode."""

    def __init__(self, a: Any, mlxd_args: str) -> None:
        self.mlxd_args, self.mlx_lm_args = mlxd_args, ""
        self.batch, self.agents = max(a.agents), a.agents
        self.rounds, self.startup_timeout = a.fleet_rounds, a.startup_timeout


def _s(rec: dict[str, Any]) -> str:
    return "error" if rec["ttft_s"] is None else f"{rec['ttft_s']:.3f} s"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


RUNNERS = {"agents": run_agents, "restart": run_restart, "fleet": run_fleets}


def bench_command(a: Any, model: Path) -> str:
    """The command line that reproduces this run (outputs left out)."""
    parts = ["mlxd bench prefix", f"--model {model}", f"--sections {','.join(a.sections)}"]
    parts += [f"--prefix-tokens {a.prefix_tokens}", f"--rounds {a.rounds}"]
    parts += [f"--max-tokens {a.max_tokens}", f"--agents {','.join(map(str, a.agents))}"]
    parts += [f"--turns {a.turns}", f"--fleet-max-tokens {a.fleet_max_tokens}"]
    parts += [f"--fleet-rounds {a.fleet_rounds}"] if a.fleet_rounds != 1 else []
    parts += [f"--seed {a.seed}"] if a.seed else []
    parts += [f"--stop-signal {a.stop_signal}"] if a.stop_signal != "INT" else []
    parts += [f"--mlxd-args {shlex.quote(a.mlxd_args)}"] if a.mlxd_args else []
    return " ".join(parts)


def run_prefix(args: Any) -> int:
    """Run the chosen sections, write JSON / markdown, print the tables; 1 on a failed request."""
    from .generate import environment

    b = Bench(args)
    result: dict[str, Any] = {
        "command": bench_command(args, b.model),
        "env": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "model": {"name": b.model.name, "path": str(b.model)},
        "banned_token_ids": b.banned,
        "log_dir": str(b.log_dir),
        "sections": {},
    }
    for name in args.sections:
        result["sections"][name] = RUNNERS[name](b)
        save_json(result, args)  # after every section, so a run cut short keeps what it measured
    result["summary"] = summarize(result)
    save_json(result, args)
    table = markdown(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table, flush=True)
    return _verdict(result)


def _verdict(result: dict[str, Any]) -> int:
    errors = result["summary"]["errors"]
    if errors:
        _say(f"mlxd bench prefix: {errors} requests failed (see the JSON)")
        return 1
    return 0
