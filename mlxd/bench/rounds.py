"""`mlxd bench serve`'s round-by-round ratios: mlxd's round r over mlx_lm.server's round r, for
tok/s and TTFT p99 at each N. They pair only as well as the rounds were run: with
`--interleave` round r of both servers is minutes apart at most (the H200's step speed moves
20-60% between minutes, docs/performance.md); run one side after the other, round r of each
is a whole side apart."""

from typing import Any

from .report import spread

METRICS = (("output_tok_s", "tok/s"), ("ttft_p99_s", "TTFT p99"))


def round_ratios(result: dict[str, Any], n: int, key: str) -> list[float]:
    """mlxd's figure over mlx_lm.server's, round by round, where both rounds have it."""
    sides = result.get("sides", {})
    mine = sides.get("mlxd", {}).get("runs", {}).get(str(n), [])
    peer = sides.get("mlx_lm", {}).get("runs", {}).get(str(n), [])
    out = []
    for a, b in zip(mine, peer, strict=False):
        x, y = a["figures"].get(key), b["figures"].get(key)
        if x is not None and y:
            out.append(x / y)
    return out


def rounds_line(result: dict[str, Any], ns: list[int]) -> str:
    """One line per N with two or more paired rounds: each metric's median [min-max] ratio."""
    lines = []
    for n in ns:
        cells = []
        for key, label in METRICS:
            if len(pairs := round_ratios(result, n, key)) >= 2:
                s = spread(pairs)
                cells.append(f"{label} {s['median']:.3f}x [{s['min']:.3f}-{s['max']:.3f}]")
        if cells:
            lines.append(f"N={n}: " + ", ".join(cells))
    if not lines:
        return ""
    how = "interleaved" if result.get("interleaved") else "one side after the other"
    return f"\nmlxd/mlx-lm round by round (rounds run {how}): " + "; ".join(lines) + "\n"
