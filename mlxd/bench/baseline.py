"""`mlxd bench serve --baseline`: mlx-lm's `generate_step` alone (raw_step.py, in its own
process) as the bound for a lone agent's ITL (raw_step.py), run just before each timed
one-agent round of each server while that server idles. Each round of a server so has a bound
measured seconds away, not a run away: the H200's step speed moves by 20-60% between stretches
of a minute (docs/performance.md), and figures pooled over a whole run mix those stretches."""

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .report import spread
from .variants import LABEL, SIDES

ROUNDS = 2  # generate_step rounds per baseline run, after its own warm-up round


def run_baseline(args: Any, model: Path) -> dict[str, Any]:
    """generate_step alone on a prompt the size of an agent's first turn, greedy,
    `--max-tokens` tokens, in a process of its own."""
    cmd = [sys.executable, "-m", "mlxd.bench.raw_step", "--model", str(model)]
    cmd += ["--prompt-tokens", str(args.system_tokens + 40), "--gen-tokens", str(args.max_tokens)]
    cmd += ["--rounds", str(ROUNDS), "--engine"]  # mlxd's engine alone too, alternated
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return {"command": cmd, "error": done.stderr[-2000:], "reason": failure_reason(done.stderr)}
    return {"command": cmd} | json.loads(done.stdout.strip().splitlines()[-1])


def failure_reason(stderr: str) -> str:
    """A failed run's last line, and what to do where the server beside it held the memory
    (an MLX server's buffer cache grows to most of a card: on an 80 GB H100 every generate_step
    run beside an idle server ran out of memory)."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    last = lines[-1] if lines else "no output"
    if "out of memory" in stderr.lower():
        last += " (the idle server beside it holds the memory: --cache-limit-gb caps both caches)"
    return last


def pooled_baseline(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' ITL as the median of all their rounds' medians, each run kept."""
    ok = [r for r in runs if "itl_p50_ms" in r]
    if not ok:
        return {"runs": runs, "error": "every generate_step run failed (see runs)"}
    rounds = [x for r in ok for x in r["round_p50_ms"]]
    first = ok[0]
    out = {
        "itl_p50_ms": statistics.median(rounds),
        "round_p50_ms": rounds,
        "prompt_tokens": first["prompt_tokens"],
        "gen_tokens": first["gen_tokens"],
        "runs": runs,
    }
    if engine := [x for r in ok for x in r.get("engine", {}).get("round_p50_ms", [])]:
        out["engine"] = {"itl_p50_ms": statistics.median(engine), "round_p50_ms": engine}
    return out


def paired_ratios(side_data: dict[str, Any], engine: bool = False) -> list[float]:
    """Each one-agent round's ITL p50 over the generate_step run made just before it
    (`engine`: over mlxd's engine alone, run in that same process)."""
    rounds = side_data.get("runs", {}).get("1", [])
    out = []
    for run, base in zip(rounds, side_data.get("baseline", []), strict=False):
        itl = run["figures"].get("itl_p50_ms")
        bound = base.get("engine", {}).get("itl_p50_ms") if engine else base.get("itl_p50_ms")
        if itl and bound:
            out.append(itl / bound)
    return out


def baseline_line(result: dict[str, Any]) -> str:
    """One agent's ITL p50 through each server against generate_step's (its bound): the
    ratio of medians, and the median [min-max] of the per-round paired ratios."""
    base, one = result.get("baseline"), result.get("summary", {}).get("1")
    if not base or "itl_p50_ms" not in base or one is None:
        return ""
    cells = []
    for side in SIDES:
        if side not in one or not one[side].get("itl_p50_ms"):
            continue
        itl = one[side]["itl_p50_ms"]["median"]
        cell = f"{LABEL[side]} {itl:.2f} ms = {itl / base['itl_p50_ms']:.3f}x"
        side_data = result.get("sides", {}).get(side, {})
        if pairs := paired_ratios(side_data):
            s = spread(pairs)
            cell += f", per round {s['median']:.3f}x [{s['min']:.3f}-{s['max']:.3f}]"
        elif failed := [b for b in side_data.get("baseline", []) if "itl_p50_ms" not in b]:
            why = failed[-1].get("reason", "see the JSON")
            cell += f" (not paired: its {len(failed)} generate_step runs failed: {why})"
        cells.append(cell)
    return (
        f"\n1 agent, ITL p50 against mlx-lm generate_step alone ({base['itl_p50_ms']:.2f} ms, "
        f"{base['prompt_tokens']}-token prompt, run before each server round): "
        + "; ".join(cells)
        + "\n"
        + engine_line(result)
    )


def engine_line(result: dict[str, Any]) -> str:
    """mlxd's engine alone (its Python API, alternated with generate_step in the bound's
    process) against generate_step, and mlxd through the server against it: the server's cost."""
    engine = result["baseline"].get("engine")
    if not engine:
        return ""
    base = result["baseline"]["itl_p50_ms"]
    line = f"mlxd's engine alone {engine['itl_p50_ms']:.2f} ms = {engine['itl_p50_ms'] / base:.3f}x"
    if pairs := paired_ratios(result.get("sides", {}).get("mlxd", {}), engine=True):
        s = spread(pairs)
        line += (
            f"; mlxd through the server against it, per round {s['median']:.3f}x "
            f"[{s['min']:.3f}-{s['max']:.3f}]"
        )
    return line + "\n"
