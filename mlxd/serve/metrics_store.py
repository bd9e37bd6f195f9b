"""Prometheus gauges and counters of each served model's prefix store, read when scraped (plain
numbers the engine thread keeps; no MLX array is touched)."""

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class StoreCollector:
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
        provider = getattr(self.state, "provider", None)
        for served in provider.loaded() if provider is not None else []:
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
