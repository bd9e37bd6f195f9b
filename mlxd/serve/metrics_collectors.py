"""The `/metrics` series read at scrape time (metrics.py registers them): each loaded engine's
rows, KV and restarts, each model's prefix store, the model pool, and MLX's allocator.

`mlxd_kv_bytes_in_use` is the KV *reservation* admission holds for the running rows (their
worst case, prompt + max_tokens); without a `--kv-budget` / `--memory-budget` nothing is
reserved and it reads 0. Reading the live caches would mean touching MLX arrays off the engine
thread, which the engine forbids: every gauge here reads plain numbers (the engines' and
stores' counters, MLX's allocator), never an MLX array."""

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def loaded(state: Any) -> list[Any]:
    """The loaded models' Served (none before the provider exists)."""
    provider = getattr(state, "provider", None)
    return provider.loaded() if provider is not None else []


class EngineCollector:
    """Gauges from every loaded engine's `stats()`, and its restarts, read when scraped."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        lab = ["model"]
        running = GaugeMetricFamily("mlxd_running_rows", "Rows decoding or prefilling", labels=lab)
        waiting = GaugeMetricFamily("mlxd_waiting_rows", "Rows queued for admission", labels=lab)
        in_use = GaugeMetricFamily(
            "mlxd_kv_bytes_in_use",
            "KV bytes reserved for the running rows (worst case; 0 without a KV budget)",
            labels=lab,
        )
        budget = GaugeMetricFamily(
            "mlxd_kv_budget_bytes", "KV budget in bytes (absent without one)", labels=lab
        )
        speed = GaugeMetricFamily(
            "mlxd_tokens_per_second", "Generated tokens per busy second of the engine", labels=lab
        )
        per_token = GaugeMetricFamily(
            "mlxd_kv_bytes_per_token",
            "Bytes one token of context adds to the full-attention KV layers, per KV scheme",
            labels=[*lab, "scheme"],
        )
        loras = GaugeMetricFamily(
            "mlxd_lora_adapters_loaded", "LoRA adapters resident in the engine", labels=lab
        )
        restarts = CounterMetricFamily(
            "mlxd_engine_restarts", "Restarts of the engine after its process died", labels=lab
        )
        for served in loaded(self.state):
            name = [served.name]
            # An engine in this process has no `restarts`: it cannot die apart from the server.
            restarts.add_metric(name, getattr(served.engine, "restarts", 0))
            loras.add_metric(name, len(served.engine.adapter_names()))
            stats = served.engine.stats()
            running.add_metric(name, stats["active"])
            waiting.add_metric(name, stats["waiting"])
            in_use.add_metric(name, stats["kv_bytes_reserved"])
            if stats["kv_budget"] is not None:
                budget.add_metric(name, stats["kv_budget"])
            speed.add_metric(name, stats["tokens_per_s"])
            for scheme, n in stats["kv_bytes_per_token"].items():
                per_token.add_metric([*name, scheme], n)
        yield from (running, waiting, in_use, budget, speed, per_token, loras, restarts)


class StoreCollector:
    """Each served model's prefix store, by tier."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        tier = ["model", "tier"]
        held = GaugeMetricFamily("mlxd_prefix_store_bytes", "Bytes the store holds", labels=tier)
        count = GaugeMetricFamily("mlxd_prefix_store_entries", "Entries in the store", labels=tier)
        lookups = CounterMetricFamily(
            "mlxd_prefix_store_lookups", "Admissions that looked a prompt up", labels=["model"]
        )
        hits = CounterMetricFamily(
            "mlxd_prefix_store_hits", "Lookups served a prefix, by tier", labels=tier
        )
        tokens = CounterMetricFamily(
            "mlxd_prefix_store_hit_tokens",
            "Prompt tokens served instead of prefilled",
            labels=["model"],
        )
        bad = CounterMetricFamily(
            "mlxd_prefix_store_quarantined", "Disk entries that failed a check", labels=["model"]
        )
        for served in loaded(self.state):
            sharing = served.engine.sharing
            if sharing is None:
                continue
            s = sharing.store.stats()
            name = served.name
            held.add_metric([name, "ram"], s["ram_bytes"])
            count.add_metric([name, "ram"], s["ram_entries"])
            lookups.add_metric([name], s["lookups"])
            hits.add_metric([name, "ram"], s["hits"] - s["ssd_hits"])
            hits.add_metric([name, "ssd"], s["ssd_hits"])
            tokens.add_metric([name], s["hit_tokens"])
            if (ssd := s.get("ssd")) is not None:
                held.add_metric([name, "ssd"], ssd["bytes"])
                count.add_metric([name, "ssd"], ssd["entries"])
                bad.add_metric([name], ssd["quarantined"])
        yield from (held, count, lookups, hits, tokens, bad)


class PoolCollector:
    """The model pool (pool.py): which models are loaded, and why each was unloaded."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("mlxd_model_loaded", "1 while loaded", labels=["model"])
        why = "Model unloads by reason (ttl, budget, request)"
        unloads = CounterMetricFamily("mlxd_model_unloads", why, labels=["model", "reason"])
        pool = getattr(getattr(self.state, "provider", None), "pool", None)
        for entry in list(pool.entries.values()) if pool is not None else []:
            loaded.add_metric([entry.name], 1 if entry.served is not None else 0)
        for (name, reason), n in dict(pool.unloads if pool is not None else {}).items():
            unloads.add_metric([name, reason], n)
        yield from (loaded, unloads)


# MLX's allocator in this process: its buffer cache is what grows on CUDA, where mlxd never
# clears it (`--prefill-clear-cache auto`), so the gauge shows how close the process is to its
# limit.
MEMORY_KINDS = {
    "active": mx.get_active_memory,  # the live arrays: weights, KV, a step's intermediates
    "cache": mx.get_cache_memory,  # freed buffers kept for reuse
    "peak": mx.get_peak_memory,  # active's high-water mark since start
    "limit": mx.get_memory_limit,  # past it the cache is trimmed: --memory-budget or MLX's own
}


class MemoryCollector:
    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "mlxd_mlx_memory_bytes",
            "MLX allocator bytes in this process (every model served here), by kind",
            labels=["kind"],
        )
        for kind, read in MEMORY_KINDS.items():
            gauge.add_metric([kind], read())
        yield gauge
