"""Statistics and the plain-text tables: every figure is a median with its min-max spread over
rounds, and every comparison is the ratio mlxd / mlx-lm taken per round pair."""

import math
import statistics
from typing import Any

SIDES = ("mlx_lm", "mlxd")

# (key in a run's record, label, better direction, digits)
SINGLE_METRICS = [
    ("prefill_tok_s", "prefill tok/s", "higher", 1),
    ("decode_tok_s", "decode tok/s", "higher", 1),
    ("ttft_s", "time to first token s", "lower", 4),
    ("peak_memory_gb", "peak memory GB", "lower", 3),
]
CONCURRENT_METRICS = [
    ("decode_tok_s", "aggregate decode tok/s", "higher", 1),
    ("e2e_tok_s", "end-to-end tok/s", "higher", 1),
    ("ttft_p50_s", "TTFT p50 s", "lower", 4),
    ("ttft_p99_s", "TTFT p99 s", "lower", 4),
    ("itl_p50_ms", "inter-token p50 ms", "lower", 3),
    ("itl_p99_ms", "inter-token p99 ms", "lower", 3),
    ("peak_memory_gb", "peak memory GB", "lower", 3),
]


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with 8 streams, p99 is the slowest one)."""
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def spread(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


def summarize(rounds: list[dict[str, Any]], metrics: list[tuple]) -> dict[str, Any]:
    """Per side: median / min / max of each metric; ratios: mlxd / mlx-lm per round pair."""
    out: dict[str, Any] = {side: {} for side in SIDES}
    out["ratio"] = {}
    for key, *_ in metrics:
        for side in SIDES:
            out[side][key] = spread([r[side][key] for r in rounds])
        pairs = [(r["mlxd"][key], r["mlx_lm"][key]) for r in rounds]
        if all(b > 0 for _, b in pairs):
            out["ratio"][key] = spread([a / b for a, b in pairs])
    return out


def _fmt(s: dict[str, Any], digits: int) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def section(title: str, summary: dict[str, Any], metrics: list[tuple]) -> str:
    header = [title, "mlx-lm median [min-max]", "mlxd median [min-max]", "mlxd/mlx-lm", "better"]
    rows = []
    for key, label, better, digits in metrics:
        ratio = summary["ratio"].get(key)
        rows.append(
            [
                label,
                _fmt(summary["mlx_lm"][key], digits),
                _fmt(summary["mlxd"][key], digits),
                _fmt(ratio, 3) if ratio else "n/a",
                better,
            ]
        )
    return _table(header, rows)


def render(result: dict[str, Any]) -> str:
    """The whole report as plain text (no colours, no box drawing: it pastes into markdown)."""
    env, args, model = result["env"], result["args"], result["model"]
    lines = [
        f"mlxd bench generate: {model['name']} ({model['source']}, {model['dtype']}, "
        f"{model['param_bytes'] / 1e9:.2f} GB of weights)",
        f"device {env['device']}; mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlxd {env['mlxd']}",
        f"prompt {args['prompt_tokens']} tokens, generate {args['gen_tokens']} tokens; "
        "ratio = mlxd/mlx-lm per interleaved round pair, median [min-max]",
    ]
    if single := result.get("single"):
        lines += ["", f"single stream (B=1), {len(single['rounds'])} rounds"]
        lines.append(section("metric", single["summary"], SINGLE_METRICS))
        lines.append(_identical_line(single))
    if conc := result.get("concurrent"):
        lines += ["", f"concurrent: {conc['streams']} streams admitted together, "]
        lines[-1] += f"{len(conc['rounds'])} rounds"
        lines.append(section("metric", conc["summary"], CONCURRENT_METRICS))
        lines.append(_identical_line(conc))
    return "\n".join(lines)


def _identical_line(part: dict[str, Any]) -> str:
    ok = part["tokens_identical"]
    verdict = "yes" if ok else "NO - the two sides did different work; ratios are meaningless"
    return f"greedy token ids identical (every round and the warm-up): {verdict}"
