"""What an engine reports (its /metrics and stats()): rows, throughput over busy time, reserved
KV and what a token of context costs under each KV scheme in use."""

from collections.abc import Callable
from typing import Any

from .handle import RequestHandle


class EngineStats:
    """Mixed into Engine: read under the admission lock, from any thread."""

    admission: Any
    kv_budget: int | None
    kv_cost: Any
    paths: Any
    _kv_schemes: set[tuple[int, int]]
    _tokens: int
    _busy_s: float
    _active: Callable[[], list[RequestHandle]]

    def stats(self) -> dict[str, Any]:
        """Rows, throughput over the engine's busy time, reserved KV, and the paths taken."""
        with self.admission.wake:
            active = self._active()
            return {
                "active": len(active),
                "waiting": len(self.admission.waiting),
                "tokens_generated": self._tokens,
                "tokens_per_s": self._tokens / self._busy_s if self._busy_s > 0 else 0.0,
                "kv_bytes_reserved": self.admission.reserved({id(h) for h in active}),
                "kv_budget": self.kv_budget,
                "kv_bytes_per_token": self.kv_bytes_per_token(),
                "paths": dict(self.paths),
            }

    def announce_scheme(self, bits: int, group_size: int) -> None:
        """A KV scheme to report in stats before any request uses it (a server's --kv-bits)."""
        self._kv_schemes.add((bits, group_size))

    def kv_bytes_per_token(self) -> dict[str, float]:
        """What one token of context costs in the growing KV layers, unquantized and under each
        KV scheme requests have used (`4bit-g64`, ...)."""
        out = {"unquantized": self.kv_cost.token_bytes()}
        for bits, group in sorted(self._kv_schemes):
            out[f"{bits}bit-g{group}"] = self.kv_cost.token_bytes(bits, group)
        return out
