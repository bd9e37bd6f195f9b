"""The outputs of `mlxd bench serve` beside its JSON: a markdown table and a PNG of throughput
and TTFT against the number of agents."""

from pathlib import Path
from typing import Any

from .accept import ACCEPT_METRICS, has_acceptance
from .lora import adapters_line
from .variants import label, ratio_pairs

# (key in a run's figures, column label, better direction, digits)
SERVE_METRICS = [
    ("output_tok_s", "output tok/s", "higher", 1),
    ("stream_tok_s_p50", "stream tok/s p50", "higher", 1),
    ("ttft_p50_s", "TTFT p50 s", "lower", 3),
    ("ttft_p99_s", "TTFT p99 s", "lower", 3),
    ("itl_p50_ms", "ITL p50 ms", "lower", 2),
    ("itl_p99_ms", "ITL p99 ms", "lower", 2),
    ("peak_rss_gb", "peak RSS GB", "lower", 3),
]


def cell(s: dict[str, Any] | None, digits: int) -> str:
    if s is None:
        return "n/a"
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def markdown(result: dict[str, Any]) -> str:
    """The table: one row per server and N, then the ratio mlxd / mlx-lm of the medians."""
    a, model, env = result["args"], result["model"], result["env"]
    sides = list(result["sides"])
    metrics = [(k, lab, d) for k, lab, _, d in SERVE_METRICS]
    metrics += ACCEPT_METRICS if has_acceptance(result) else []
    lines = [
        f"`{result['command']}`",
        "",
        f"model {model['name']} ({model['path']}); device {env['device']}, {env['cpu_count']} "
        f"CPUs; mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlxd {env['mlxd']}",
        _workload_line(result) + f"; {a['rounds']} round(s) per N "
        "(median [min-max]); caps: " + ", ".join(_caps(result, s) for s in sides),
        *adapters_line(a.get("adapters")),
        *_variant_lines(result),
        "",
    ]
    head = ["agents", "server", *(m[1] for m in metrics), "requests", "out tokens"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, per in result["summary"].items():
        for side in sides:
            cells = [cell(per[side].get(k), d) for k, _, d in metrics]
            counts = [str(per[side]["requests"]), str(per[side]["output_tokens"])]
            lines.append(f"| {n} | {label(side)} | " + " | ".join(cells + counts) + " |")
        for x, y in ratio_pairs(sides):
            ratios = per.get("ratios", {}).get(f"{x}/{y}", per["ratio"])
            cells = ["n/a" if (r := ratios.get(k)) is None else f"{r:.3f}" for k, *_ in metrics]
            lines.append(f"| {n} | {label(x)}/{label(y)} | " + " | ".join(cells) + " | | |")
    better = ", ".join(f"{lab}: {b}" for _, lab, b, _ in SERVE_METRICS)
    lines += ["", f"better: {better}; ITL is the gap between streamed chunks; stream tok/s: a "]
    lines[-1] += "reply's tokens after its first over the time from its first chunk to its last."
    if has_acceptance(result):
        lines[-1] += " accept rate: accepted / drafted tokens; accepted/req: per request."
    return "\n".join(lines) + "\n"


def _workload_line(result: dict[str, Any]) -> str:
    a, model = result["args"], result["model"]
    if a.get("workload") == "edit":
        runs = result.get("workload", {}).get("sources", {}).values()
        sizes = [s["tokens"] for agents in runs for s in agents]
        here = f" ({min(sizes)}-{max(sizes)} here)" if sizes else ""
        return (
            f"edit: each agent sends its own Python file of up to {a['file_tokens']} tokens"
            f"{here} and asks for it back with one change, "
            f"{a['turns']} turn(s) (EOS ends a reply)"
        )
    return (
        f"{a['turns']} turns per agent, {a['max_tokens']} tokens per turn (EOS banned), system "
        f"prompt {model['system_tokens']} tokens"
    )


def _variant_lines(result: dict[str, Any]) -> list[str]:
    """Each variant's flags, and whether its greedy replies were mlxd's to the byte."""
    same = result.get("same_replies", {})
    peer = [f"mlx-lm: replies identical to mlxd's: {same['mlx_lm']}"] if "mlx_lm" in same else []
    return peer + [
        f"{label(side)}: {' '.join(['mlxd', *map(str, data.get('flags', []))])}"
        + (f"; replies identical to mlxd's: {same[side]}" if side in same else "")
        for side, data in result["sides"].items()
        if side.startswith("mlxd-")
    ]


def _caps(result: dict[str, Any], side: str) -> str:
    return f"{label(side)} {result['sides'][side]['cap']}"


def plot(result: dict[str, Any], path: str | Path) -> None:
    """Output tok/s and TTFT (p50 solid, p99 dashed) against N, medians with min-max bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [int(n) for n in result["summary"]]
    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    palette = iter(["tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"])
    for side in result["sides"]:
        colour = {"mlx_lm": "tab:blue", "mlxd": "tab:orange"}.get(side) or next(palette, "gray")
        for ax, key, style, name in (
            (ax_tps, "output_tok_s", "-o", label(side)),
            (ax_ttft, "ttft_p50_s", "-o", f"{label(side)} p50"),
            (ax_ttft, "ttft_p99_s", "--s", f"{label(side)} p99"),
        ):
            stats = [result["summary"][str(n)][side].get(key) for n in ns]
            if any(s is None for s in stats):
                continue
            med = [s["median"] for s in stats]
            err = [
                [m - s["min"] for m, s in zip(med, stats, strict=True)],
                [s["max"] - m for m, s in zip(med, stats, strict=True)],
            ]
            ax.errorbar(ns, med, yerr=err, fmt=style, color=colour, label=name, capsize=3)
    a = result["args"]
    ax_tps.set(title="aggregate output throughput", xlabel="agents N", ylabel="output tok/s")
    ax_ttft.set(title="time to first token", xlabel="agents N", ylabel="TTFT s")
    for ax in (ax_tps, ax_ttft):
        if len(ns) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{result['model']['name']}: {a['turns']} turns x {a['max_tokens']} tokens, "
        f"system prompt {result['model']['system_tokens']} tokens, {result['env']['device']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
