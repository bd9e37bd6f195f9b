"""Whether a batched step drafts, and how wide: measured acceptance against measured step cost.

Each drafting row keeps a decayed count of its drafts' acceptance (a draft token is accepted
with probability p once the ones before it were), updated by verify steps and, while it does not
draft, by checking what it would have drafted against the token that came (free). A step of
width K (K drafts a row, K + 1 positions) emits Σ_i (1 - p_i^(k_i+1)) / (1 - p_i) tokens against
one per row for a plain step; its cost relative to a plain step is measured per (rows, K) from
the steps' wall time. The width with the best expected tokens per unit of cost wins, and only
if it beats a plain step by `MARGIN`: text with nothing to copy keeps the plain, pipelined step.
"""

import time
from dataclasses import dataclass, field

DECAY = 0.85  # weight of past acceptance per draft token tried since
MARGIN = 0.05  # a verify step must promise this much more than a plain one
PRIOR_COST = 0.15  # a position's cost relative to a one-token step, until measured
EMA = 0.2  # weight of a new wall-time sample
REFRESH = 64  # verify steps of a rows bucket before a plain step re-measures its baseline


@dataclass
class Acceptance:
    """One row's acceptance: decayed accepted / tried draft tokens, with one of each as prior."""

    accepted: float = 0.0
    tried: float = 0.0

    @property
    def p(self) -> float:
        return (self.accepted + 1.0) / (self.tried + 2.0)

    def update(self, drafted: int, accepted: int) -> None:
        """A run of `drafted` tokens of which the first `accepted` matched."""
        tried = accepted + (1 if accepted < drafted else 0)
        fade = DECAY**tried  # the past fades by the tokens tried, not by the runs
        self.accepted = self.accepted * fade + accepted
        self.tried = self.tried * fade + tried

    def forget(self, keep: float) -> None:
        """Fade what was measured by `keep` (the estimate drifts back to the prior)."""
        self.accepted *= keep
        self.tried *= keep

    def expected(self, k: int) -> float:
        """Tokens a step emits for this row with k drafts: 1 + p + ... + p^k."""
        p = min(self.p, 0.999)
        return (1.0 - p ** (k + 1)) / (1.0 - p)


def _bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()  # 1, 2, 4, 8, ...


@dataclass
class StepCosts:
    """Wall time of plain and verify steps by (rows bucket, width), as moving averages."""

    seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    since: dict[int, int] = field(default_factory=dict)  # verify steps since a plain sample
    _last: tuple[float, int, int] | None = None  # (start, rows, width) of the step running

    def start(self, rows: int, width: int) -> None:
        """A step starts: the previous one's time is from its start to now (its turn's whole
        period, events and all, as the engine spends it)."""
        now = time.perf_counter()
        if self._last is not None:
            t0, r, w = self._last
            key = (_bucket(r), w)
            dt, old = now - t0, self.seconds.get(key)
            if old is None:
                self.seconds[key] = dt
            else:  # a turn that also prefilled joiners or waited idle counts at most 3x
                self.seconds[key] = old + EMA * (min(dt, 3 * old) - old)
            self.since[key[0]] = 0 if w == 0 else self.since.get(key[0], 0) + 1
        self._last = (now, rows, width)

    def needs_plain(self, rows: int) -> bool:
        """A plain step must (re-)measure the baseline: a row that always has drafts (a draft
        model's) would otherwise be priced against the prior forever."""
        b = _bucket(rows)
        return (b, 0) not in self.seconds or self.since.get(b, 0) >= REFRESH

    def pause(self) -> None:
        """The batch is idle or changed shape: the next start measures nothing."""
        self._last = None

    def ratio(self, rows: int, width: int) -> float:
        """A width-K step's cost over a plain step's, for this many rows: 1 + a*K, the slope a
        fitted to every width measured (one bad width informs the others), PRIOR_COST before."""
        b = _bucket(rows)
        plain = self.seconds.get((b, 0))
        if plain is None or plain <= 0:
            return 1.0 + PRIOR_COST * width
        num = den = 0.0
        for (bucket, k), t in self.seconds.items():
            if bucket == b and k > 0:
                num += (t / plain - 1.0) * k
                den += k * k
        slope = max(num / den, 0.0) if den else PRIOR_COST
        return 1.0 + slope * width


def choose_width(
    rows: int, drafts: list[tuple[Acceptance, int]], costs: StepCosts, ceiling: int
) -> int:
    """The width (drafts a row) that maximizes expected tokens per cost, or 0 for a plain step.
    `drafts`: each drafting row's acceptance and how many tokens it could draft."""
    if not drafts or ceiling <= 0:
        return 0
    best_k, best_rate = 0, float(rows) * (1.0 + MARGIN)
    for k in range(1, ceiling + 1):
        gain = sum(a.expected(min(k, n)) - 1.0 for a, n in drafts if n > 0)
        rate = (rows + gain) / costs.ratio(rows, k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k
