"""A Prometheus gauge of MLX's allocator in this process, read when scraped. Its buffer cache is
what grows on CUDA, where mlxd never clears it (`--prefill-clear-cache auto`): the gauge shows
how close the process is to its limit. Allocator counters only: no MLX array is touched."""

from collections.abc import Iterator

import mlx.core as mx
from prometheus_client.core import GaugeMetricFamily, Metric

KINDS = {
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
        for kind, read in KINDS.items():
            gauge.add_metric([kind], read())
        yield gauge
