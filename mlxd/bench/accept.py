"""Speculative decoding's acceptance in `mlxd bench serve`, from what each response's usage says
(OpenAI's `completion_tokens_details`): drafted = accepted + rejected prediction tokens."""

from typing import Any

# (key in a run's figures, column label, digits)
ACCEPT_METRICS = [
    ("acceptance_rate", "accept rate", 3),
    ("accepted_per_request", "accepted/req", 1),
]


def drafts(usage: dict[str, Any]) -> dict[str, int | None]:
    """A response's accepted and rejected prediction tokens; None where it does not say."""
    details = usage.get("completion_tokens_details") or {}
    got = {k: details.get(f"{k}_prediction_tokens") for k in ("accepted", "rejected")}
    return {f"{k}_tokens": v if isinstance(v, int) else None for k, v in got.items()}


def acceptance(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the requests that reported drafts: the acceptance rate accepted / drafted (None
    when nothing was drafted), accepted tokens per request and the totals; all None when no
    request reported them (a server without speculation)."""
    told = [r for r in ok if r.get("accepted_tokens") is not None]
    if not told:
        return {
            "accepted_tokens": None,
            "rejected_tokens": None,
            "acceptance_rate": None,
            "accepted_per_request": None,
        }
    accepted = sum(r["accepted_tokens"] for r in told)
    rejected = sum(r.get("rejected_tokens") or 0 for r in told)
    drafted = accepted + rejected
    return {
        "accepted_tokens": accepted,
        "rejected_tokens": rejected,
        "acceptance_rate": accepted / drafted if drafted else None,
        "accepted_per_request": accepted / len(told),
    }


def has_acceptance(result: dict[str, Any]) -> bool:
    """Whether any run of any side reported drafts (the table then shows acceptance)."""
    return any(
        run["figures"].get("accepted_tokens") is not None
        for data in result.get("sides", {}).values()
        for runs in data.get("runs", {}).values()
        for run in runs
    )


def same_replies(result: dict[str, Any]) -> dict[str, str]:
    """Per mlxd variant: how many of its replies equal plain mlxd's reply to the same request
    (N, round, agent, turn) byte for byte, e.g. "16 of 16": reported, not required. With
    --adapters mlx_lm.server's too (the same adapter per agent), and the base side's count
    tells how many replies the adapters left as they were."""

    def replies(data: dict[str, Any]) -> dict[tuple, str]:
        return {
            (n, r, q["agent"], q["turn"]): q["reply_sha1"]
            for n, runs in data.get("runs", {}).items()
            for r, run in enumerate(runs)
            for q in run["requests"]
            if q.get("error") is None and "reply_sha1" in q
        }

    sides = result.get("sides", {})
    if "mlxd" not in sides:
        return {}
    base = replies(sides["mlxd"])
    with_adapters = bool(result.get("args", {}).get("adapters"))
    out = {}
    for side, data in sides.items():
        if side.startswith("mlxd-") or (side == "mlx_lm" and with_adapters):
            mine = replies(data)
            both = [k for k in mine if k in base]
            out[side] = f"{sum(mine[k] == base[k] for k in both)} of {len(both)}"
    return out
