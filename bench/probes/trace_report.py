"""Read an engine trace (MLXD_TRACE, engine/instrument.py): the turns where rows joined or the loop
stalled, the decode step's median per batch size (mlx-lm's step, and the loop's whole turn
around it), what rows leaving cost, and when a join's requests reached the server and the
engine before its turn (traces written before arrival times were recorded show none).

    python -m bench.probes.trace_report trace.jsonl [--stall 0.05]
"""

import argparse
import gzip
import json
import statistics
from collections.abc import Iterable
from typing import Any

PHASES = ("admit", "fork", "serial", "batch", "tick")


def load(path: str) -> list[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def events(turns: Iterable[dict[str, Any]], stall: float) -> list[dict[str, Any]]:
    """Turns that admitted or moved rows, prefilled in the batch, or spent more than `stall`
    seconds in a phase other than an idle admission."""
    out = []
    for x in turns:
        busy = any(x.get(p, 0.0) > stall for p in PHASES if p != "admit")
        waited = x.get("admit", 0.0) > stall and (x.get("waiting", 0) or x.get("paths"))
        prefill = any(g.get("prompt_tokens", 0) for g in x.get("gen", []))
        if x.get("paths") or busy or waited or prefill:
            out.append(x)
    return out


def decode_steps(turns: Iterable[dict[str, Any]]) -> dict[int, list[float]]:
    """Seconds of each plain decode step (no prefill in the turn), by the batch's rows after
    the turn (a step in which rows finished counts under the rows left)."""
    by: dict[int, list[float]] = {}
    for x in turns:
        for g in x.get("gen", []):
            if g.get("decode_steps") == 1 and not g.get("prompt_tokens"):
                by.setdefault(g["rows"], []).append(g["decode_s"])
    return by


def cycles(turns: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Seconds from each plain decode turn's start to the next turn's: the step plus everything
    else the engine loop did around it (admission, the row's events, waits for the GIL)."""
    by: dict[int, list[float]] = {}
    for x, nxt in zip(turns, turns[1:], strict=False):
        gens = x.get("gen", [])
        if len(gens) == 1 and gens[0].get("decode_steps") == 1 and not gens[0].get("prompt_tokens"):
            by.setdefault(gens[0]["rows"], []).append(nxt["t"] - x["t"])
    return by


LEAVE = ("leave_step", "filter", "finish")


def leaves(turns: Iterable[dict[str, Any]]) -> str | None:
    """Turns where rows left the batch (traced parts): each part's median and sum, in ms."""
    got = [x["parts"] for x in turns if "filter" in x.get("parts", {})]
    if not got:
        return None
    cells = []
    for k in LEAVE:
        s = [p[k] for p in got if k in p]
        if s:
            cells.append(f"{k} {1e3 * statistics.median(s):.1f} ms (sum {1e3 * sum(s):.0f})")
    return f"rows leaving, {len(got)} turns, median: " + ", ".join(cells)


def line(x: dict[str, Any]) -> str:
    phases = " ".join(f"{p} {x[p]:.3f}" for p in PHASES if p in x)
    gen = " ".join(
        f"[rows {g['rows']}: prompt {g['prompt_tokens']} in {g['prompt_s']:.3f}, "
        f"decode {g['decode_steps']} in {g['decode_s']:.3f}]"
        for g in x.get("gen", [])
    )
    paths = f" {x['paths']}" if x.get("paths") else ""
    got = x.get("parts", {})
    shape = f" shape {'x'.join(map(str, got['shape']))}" if "shape" in got else ""
    split = " ".join(f"{k} {v:.3f}" for k, v in got.items() if k != "shape")
    parts = f"\n{'':11}parts: {split}{shape}" if got else ""
    return (
        f"{x['t']:9.3f}  {phases}  active {x['active']} waiting {x['waiting']} {gen}{paths}"
        + parts
        + arrivals(x)
    )


def arrivals(x: dict[str, Any]) -> str:
    """A join's requests, relative to its turn's start: when they reached the server (`came`)
    and the engine (`queued`, after their prompts were built), first and last."""
    spans = [f"{k} {1e3 * (x[k][0] - x['t']):+.1f}..{1e3 * (x[k][1] - x['t']):+.1f} ms"
             for k in ("came", "queued") if k in x]  # fmt: skip
    return f"\n{'':11}requests: " + ", ".join(spans) if spans else ""


def report(turns: list[dict[str, Any]], stall: float) -> list[str]:
    lines = [f"{len(turns)} turns; events (joins, moves, prefills, phases over {stall}s):"]
    lines += [line(x) for x in events(turns, stall)]
    lines.append("decode step by rows: median ms (steps) | turn to next turn, median ms")
    loop = cycles(turns)
    for rows, s in sorted(decode_steps(turns).items()):
        cycle = f" | {1e3 * statistics.median(loop[rows]):7.2f}" if rows in loop else ""
        lines.append(f"  {rows:3d} rows: {1e3 * statistics.median(s):7.2f} ms ({len(s)}){cycle}")
    if summary := leaves(turns):
        lines.append(summary)
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="an MLXD_TRACE file (.jsonl or .jsonl.gz)")
    p.add_argument("--stall", type=float, default=0.05, help="seconds a phase must take to show")
    a = p.parse_args(argv)
    print("\n".join(report(load(a.trace), a.stall)))


if __name__ == "__main__":
    main()
