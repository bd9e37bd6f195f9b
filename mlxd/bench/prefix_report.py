"""The figures of `mlxd bench prefix`: medians [min-max] over rounds, and ratios taken per round
(the two sides of a ratio are measured minutes apart at most, so machine drift mostly cancels)."""

import statistics
from typing import Any

from .plot import cell
from .report import spread
from .serve import summarize as serve_summarize

FLEET_KEYS = [  # (key, label, digits): on/off ratios of medians
    ("ttft_p50_s", "TTFT p50 s", 3),
    ("ttft_p99_s", "TTFT p99 s", 3),
    ("output_tok_s", "output tok/s", 1),
    ("peak_rss_gb", "peak RSS GB", 3),
]


def _ttft(rec: dict[str, Any]) -> float | None:
    return rec["ttft_s"] if rec["error"] is None else None


def _spread(xs: list[float | None]) -> dict[str, Any] | None:
    vals = [x for x in xs if x is not None]
    return spread(vals) if vals else None


def _ratios(pairs: list[tuple[Any, Any]]) -> dict[str, Any] | None:
    return _spread([a / b if a is not None and b else None for a, b in pairs])


FIELDS = (("ttft_s", "ttft_s"), ("cached", "cached_tokens"), ("prompt", "prompt_tokens"))


def _per_request(rounds: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, Any]:
    """`<name>_ttft_s`, `<name>_cached`, `<name>_prompt`: spreads over rounds."""
    return {
        f"{name}_{key}": _spread([r[name][src] for r in rounds])
        for name in names
        for key, src in FIELDS
    }


def summarize_agents(sec: dict[str, Any]) -> dict[str, Any]:
    rounds = sec["rounds"]
    out = _per_request(rounds, ("a", "b"))
    out["cold_over_warm"] = _ratios([(_ttft(r["a"]), _ttft(r["b"])) for r in rounds])
    return out


def summarize_restart(sec: dict[str, Any]) -> dict[str, Any]:
    rounds = sec["rounds"]
    out = _per_request(rounds, ("first", "restored", "reprefill"))
    out["reprefill_over_restored"] = _ratios(
        [(_ttft(r["reprefill"]), _ttft(r["restored"])) for r in rounds]
    )
    out["exit_codes"] = [r["stop"]["exit_code"] for r in rounds]
    out["killed"] = sum(r["stop"]["killed_after_timeout"] for r in rounds)
    return out


def summarize_fleet(sec: dict[str, Any], ns: list[int]) -> dict[str, Any]:
    """bench serve's per-N medians for each mode, the token counts, and on/off ratios."""
    per_n = serve_summarize({"sides": sec}, ns)
    for n, per in per_n.items():
        for mode in sec:
            figs = [run["figures"] for run in sec[mode]["runs"][n]]
            for key in ("prompt_tokens", "cached_tokens"):
                vals = [f[key] for f in figs if f[key] is not None]
                per[mode][key] = statistics.median(vals) if vals else None
        per["ratio"] = {}
        for key, *_ in FLEET_KEYS:
            on, off = per["on"].get(key), per["off"].get(key)
            if on and off and off["median"] > 0:
                per["ratio"][key] = on["median"] / off["median"]
    return per_n


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    secs = result["sections"]
    out: dict[str, Any] = {"errors": count_errors(secs)}
    if "agents" in secs:
        out["agents"] = summarize_agents(secs["agents"])
    if "restart" in secs:
        out["restart"] = summarize_restart(secs["restart"])
    if "fleet" in secs:
        out["fleet"] = summarize_fleet(secs["fleet"], result["args"]["agents"])
    return out


def count_errors(secs: dict[str, Any]) -> int:
    n = sum(
        r[w]["error"] is not None for r in secs.get("agents", {}).get("rounds", []) for w in "ab"
    )
    restart = secs.get("restart", {}).get("rounds", [])
    n += sum(r[w]["error"] is not None for r in restart for w in ("first", "restored", "reprefill"))
    for mode in secs.get("fleet", {}).values():
        n += sum(run["figures"]["errors"] for runs in mode["runs"].values() for run in runs)
    return n


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _agents_md(s: dict[str, Any]) -> list[str]:
    head = ["agent", "TTFT s", "cached tokens", "prompt tokens"]
    rows = [
        [label, cell(s[f"{w}_ttft_s"], 3), cell(s[f"{w}_cached"], 0), cell(s[f"{w}_prompt"], 0)]
        for w, label in (("a", "A (cold)"), ("b", "B (shared prefix)"))
    ]
    return [
        "## 1. Second agent with a shared system prompt vs cold",
        "",
        *_table(head, rows),
        "",
        f"**TTFT cold / warm (A / B): {cell(s['cold_over_warm'], 2)}** (per-round ratio)",
        "",
    ]


def _restart_md(s: dict[str, Any]) -> list[str]:
    head = ["request", "TTFT s", "cached tokens", "prompt tokens"]
    rows = [
        [label, cell(s[f"{w}_ttft_s"], 3), cell(s[f"{w}_cached"], 0), cell(s[f"{w}_prompt"], 0)]
        for w, label in (
            ("first", "server 1, cold (--ssd-cache)"),
            ("restored", "server 2, restored from disk"),
            ("reprefill", "no disk tier, empty store (re-prefill)"),
        )
    ]
    codes = ", ".join(map(str, s["exit_codes"]))
    return [
        "## 2. Restart: TTFT restored from --ssd-cache vs re-prefill",
        "",
        *_table(head, rows),
        "",
        f"**TTFT re-prefill / restored: {cell(s['reprefill_over_restored'], 2)}** (per-round "
        f"ratio); server 1 exit codes {codes}, killed after the stop timeout: {s['killed']}",
        "",
    ]


def _fleet_md(per_n: dict[str, Any]) -> list[str]:
    head = ["agents", "store", *(label for _, label, _ in FLEET_KEYS), "prompt tok", "cached tok"]
    rows = []
    for n, per in per_n.items():
        for mode in ("on", "off"):
            f = per[mode]
            cells = [cell(f.get(k), d) for k, _, d in FLEET_KEYS]
            counts = [_num(f["prompt_tokens"]), _num(f["cached_tokens"])]
            rows.append([n, mode, *cells, *counts])
        ratios = [per["ratio"].get(k) for k, *_ in FLEET_KEYS]
        rows.append([n, "on/off", *("n/a" if r is None else f"{r:.3f}" for r in ratios), "", ""])
    return [
        "## 3. Agent fleet: store on (defaults) vs off (--prompt-cache-size 0)",
        "",
        *_table(head, rows),
        "",
        "on/off below 1 is better for TTFT and RSS, above 1 for tok/s; token counts are sums "
        "over a run's requests (median over rounds).",
        "",
    ]


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def markdown(result: dict[str, Any]) -> str:
    a, env, s = result["args"], result["env"], result["summary"]
    lines = [
        f"`{result['command']}`",
        "",
        f"model {result['model']['name']}; device {env['device']}, {env['cpu_count']} CPUs; "
        f"mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlxd {env['mlxd']}",
        f"shared prefix {a['prefix_tokens']} tokens (system prompt); sections 1-2: "
        f"{a['rounds']} round(s), {a['max_tokens']} tokens per reply, greedy; median [min-max]",
        "",
    ]
    if "agents" in s:
        lines += _agents_md(s["agents"])
    if "restart" in s:
        lines += _restart_md(s["restart"])
    if "fleet" in s:
        lines += _fleet_md(s["fleet"])
    return "\n".join(lines)
