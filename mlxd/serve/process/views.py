"""The parts of an Engine the server reads as attributes (its store's stats, its admission's
drain time), as views over calls to the engine's process (remote.py)."""

from typing import Any


class Store:
    """`engine.sharing.store` as the server reads it: the last stats the process sent."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def closed(self) -> bool:
        return self.engine.closing

    def close(self) -> None:
        """The process closes its own store (RemoteEngine.close)."""

    def stats(self) -> dict[str, Any]:
        return self.engine.stats_all().get("store") or {}


class Sharing:
    def __init__(self, engine: Any) -> None:
        self.store = Store(engine)


class Admission:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def drain_s(self) -> float | None:
        try:
            return self.engine.call("drain_s", timeout=2)
        except Exception:  # noqa: BLE001 - a Retry-After guess: none is a fine answer
            return None


# What stats() says while the process restarts (its rows counted by the server).
EMPTY_STATS = {
    "active": 0, "waiting": 0, "tokens_generated": 0, "tokens_per_s": 0.0,
    "kv_bytes_reserved": 0, "kv_budget": None, "kv_bytes_per_token": {}, "paths": {},
}  # fmt: skip
