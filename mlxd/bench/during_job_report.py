"""`mlxd bench serve --during-job`'s figures: per round, each arm's ITL p99 / p50, TTFT p99 and
output tok/s and their ratios job/none; per N, the medians over the valid rounds (the job
training throughout) and the job's own training steps/s; the markdown table."""

from typing import Any

from .report import spread

# (key, label, digits); "better" reads the same for every ratio: latency lower, tok/s higher.
METRICS = (
    ("itl_p99_ms", "ITL p99 (ms)", 2),
    ("itl_p50_ms", "ITL p50 (ms)", 2),
    ("ttft_p99_s", "TTFT p99 (s)", 3),
    ("output_tok_s", "output tok/s", 1),
)


def round_ratios(one: dict[str, Any]) -> dict[str, float]:
    """One round's job/none ratio of each metric where both arms have it."""
    out = {}
    for key, *_ in METRICS:
        x, y = one["job"]["figures"].get(key), one["none"]["figures"].get(key)
        if x is not None and y:
            out[key] = x / y
    return out


def summarize(result: dict[str, Any], ns: list[int]) -> dict[str, Any]:
    """Per N: each arm's metric median [min-max] and the median [min-max] of the per-round
    ratios, over the valid rounds only; the job's steps/s; which rounds were invalid."""
    out: dict[str, Any] = {}
    for n in ns:
        rounds = result["rounds"].get(str(n), [])
        valid = [one for one in rounds if one["job"]["training"]["valid"]]
        bad = [one["round"] for one in rounds if one not in valid]
        per: dict[str, Any] = {"valid_rounds": len(valid), "invalid_rounds": bad}
        for arm in ("none", "job"):
            per[arm] = {}
            for key, *_ in METRICS:
                vals = [o[arm]["figures"][key] for o in valid if o[arm]["figures"].get(key)]
                per[arm][key] = spread(vals) if vals else None
        per["ratios"] = {}
        for key, *_ in METRICS:
            vals = [o["ratios"][key] for o in valid if key in o["ratios"]]
            per["ratios"][key] = spread(vals) if vals else None
        rates = [o["job"]["training"]["steps_per_s"] for o in valid]
        per["job_steps_per_s"] = spread(rates) if rates else None
        out[str(n)] = per
    return out


def _cell(s: dict[str, Any] | None, digits: int, unit: str = "") -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def markdown(result: dict[str, Any]) -> str:
    """Per N, one row per metric: no job, job training, and the per-round ratio's median."""
    job = result.get("job", {})
    lines = [
        f"mlxd bench serve --during-job {job.get('type')}: {result['model']['name']}, "
        "one mlxd server; rounds alternate the agents alone and with a background LoRA job "
        "training on the same model (order swapped every round)",
        "",
        "| N | metric | no job, median [min-max] | job training | job/none per round, median |",
        "|---|---|---|---|---|",
    ]
    for n, per in result["summary"].items():
        for key, label, digits in METRICS:
            cells = [_cell(per["none"][key], digits), _cell(per["job"][key], digits),
                     _cell(per["ratios"][key], 3, "x")]  # fmt: skip
            lines.append(f"| {n} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for n, per in result["summary"].items():
        rate = _cell(per["job_steps_per_s"], 2)
        bad = per["invalid_rounds"]
        note = f"; INVALID rounds (job not training throughout): {bad}" if bad else ""
        lines.append(
            f"N={n}: {per['valid_rounds']} valid rounds; the job trained {rate} steps/s "
            f"during the job rounds{note}"
        )
    return "\n".join(lines) + "\n"
