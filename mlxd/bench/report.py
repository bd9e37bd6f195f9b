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
    ("itl_p50_ms", "inter-token p50 ms", "lower", 3),
    ("itl_p10_ms", "inter-token p10 ms", "lower", 3),
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


def first_divergence(a: list, b: list) -> int | None:
    """The first token index where two runs differ (None: identical); runs are token lists or,
    for concurrent runs, lists of per-stream token lists."""
    a_streams, b_streams = (a, b) if a and isinstance(a[0], list) else ([a], [b])
    found = [
        next((i for i, (x, y) in enumerate(zip(sa, sb, strict=False)) if x != y), len(sa))
        for sa, sb in zip(a_streams, b_streams, strict=True)
        if sa != sb
    ]
    return min(found) if found else None


def consistency(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Greedy tokens: mlxd vs mlx-lm per pair, and each side against its own first run (the
    control: a backend that is not bit-deterministic makes mlx-lm differ from itself too)."""
    cross = [first_divergence(r["mlx_lm"]["tokens"], r["mlxd"]["tokens"]) for r in runs]
    own = {
        side: [first_divergence(runs[0][side]["tokens"], r[side]["tokens"]) for r in runs[1:]]
        for side in SIDES
    }
    if all(d is None for d in cross):
        verdict = "identical"
    elif any(d is not None for d in own["mlx_lm"]):
        verdict = "backend-nondeterministic"
    else:
        verdict = "MISMATCH"
    return {
        "verdict": verdict,
        "tokens_identical": verdict == "identical",
        "first_divergence": {"mlxd_vs_mlx_lm": cross, **own},
    }


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


def pooled_steps(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Every inter-token step of every round, pooled per side: p10 / p25 / p50 in ms. Per-round
    medians swing with the host's load; the pooled low percentiles show the step itself."""
    out: dict[str, dict[str, float]] = {}
    for side in SIDES:
        steps = [
            b - a
            for r in rounds
            for a, b in zip(r[side]["token_times_ms"], r[side]["token_times_ms"][1:], strict=False)
        ]
        out[side] = {f"p{q}": percentile(steps, q) for q in (10, 25, 50)} if steps else {}
    return out


def _pooled_line(rounds: list[dict[str, Any]]) -> str:
    pooled = pooled_steps(rounds)
    a, b = pooled["mlx_lm"], pooled["mlxd"]
    if not a or not b:
        return "pooled steps: none (one token per run)"
    cells = [f"{q} {a[q]:.3f} / {b[q]:.3f} ms ({a[q] / b[q]:.3f})" for q in a]
    return "pooled steps, mlx-lm / mlxd (speed ratio): " + ", ".join(cells)


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
    if args.get("kv_bits") is not None:
        lines.append(
            f"KV: {args['kv_bits']}-bit, group {args['kv_group_size']}, from token "
            f"{args['quantized_kv_start']} (both sides)"
        )
    if single := result.get("single"):
        lines += ["", f"single stream (B=1), {len(single['rounds'])} rounds"]
        lines.append(section("metric", single["summary"], SINGLE_METRICS))
        lines.append(_pooled_line(single["rounds"]))
        if "engine_paths" in single:
            paths = ", ".join(f"{k} {v}" for k, v in sorted(single["engine_paths"].items()))
            lines.append(f"mlxd's paths: {paths}")
        lines.append(_identical_line(single))
    if conc := result.get("concurrent"):
        lines += ["", f"concurrent: {conc['streams']} streams admitted together, "]
        lines[-1] += f"{len(conc['rounds'])} rounds"
        lines.append(section("metric", conc["summary"], CONCURRENT_METRICS))
        lines.append(_identical_line(conc))
    return "\n".join(lines)


def _span(xs: list[int | None]) -> str:
    hits = [x for x in xs if x is not None]
    if not hits:
        return f"never ({len(xs)} runs)"
    return f"token {min(hits)}-{max(hits)} in {len(hits)} of {len(xs)} runs"


def _identical_line(part: dict[str, Any]) -> str:
    """The verdict of `consistency`, in words, with where the runs first differ."""
    div = part["first_divergence"]
    verdict = part["verdict"]
    if verdict == "identical":
        return "greedy token ids: identical on both sides in every round and the warm-up"
    where = (
        f"mlxd vs mlx-lm first differ at {_span(div['mlxd_vs_mlx_lm'])}; "
        f"mlx-lm vs its own first run: {_span(div['mlx_lm'])}; "
        f"mlxd vs its own first run: {_span(div['mlxd'])}"
    )
    if verdict == "backend-nondeterministic":
        head = "greedy token ids: NOT identical, and mlx-lm is not deterministic against itself "
        return head + f"on this backend either (so no bitwise check is possible here):\n  {where}"
    return f"greedy token ids: MISMATCH - the sides did different work, ratios are void:\n  {where}"
