"""`mlxd bench serve`'s round-by-round ratios: mlxd's round r over mlx_lm.server's round r, for
tok/s and TTFT p99 at each N. They pair only as well as the rounds were run: with
`--interleave` round r of both servers is minutes apart at most (the H200's step speed moves
20-60% between minutes, docs/performance.md); run one side after the other, round r of each
is a whole side apart."""

from typing import Any

from .report import spread
from .variants import label, ratio_pairs

METRICS = (("output_tok_s", "tok/s"), ("ttft_p99_s", "TTFT p99"))


def round_ratios(
    result: dict[str, Any], n: int, key: str, mine_side: str = "mlxd", peer_side: str = "mlx_lm"
) -> list[float]:
    """mlxd's figure over mlx_lm.server's (or one side's over another's), round by round, where
    both rounds have it."""
    sides = result.get("sides", {})
    mine = sides.get(mine_side, {}).get("runs", {}).get(str(n), [])
    peer = sides.get(peer_side, {}).get("runs", {}).get(str(n), [])
    out = []
    for a, b in zip(mine, peer, strict=False):
        x, y = a["figures"].get(key), b["figures"].get(key)
        if x is not None and y:
            out.append(x / y)
    return out


def rounds_line(result: dict[str, Any], ns: list[int]) -> str:
    """Per compared pair of sides, one line per N with two or more paired rounds: each
    metric's median [min-max] ratio."""
    how = "interleaved" if result.get("interleaved") else "one side after the other"
    out = ""
    for a, b in ratio_pairs(list(result.get("sides", {}))):
        lines = []
        for n in ns:
            cells = []
            for key, name in METRICS:
                if len(pairs := round_ratios(result, n, key, a, b)) >= 2:
                    s = spread(pairs)
                    cells.append(f"{name} {s['median']:.3f}x [{s['min']:.3f}-{s['max']:.3f}]")
            if cells:
                lines.append(f"N={n}: " + ", ".join(cells))
        if lines:
            head = f"{label(a)}/{label(b)} round by round (rounds run {how}): "
            out += "\n" + head + "; ".join(lines) + "\n"
    return out
