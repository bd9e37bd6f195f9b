"""What a served model may hold: its KV budget (`--kv-budget`, `--memory-budget`), MLX's memory
limit, and its prompt store (mlx_lm.server's --prompt-cache-size and --prompt-cache-bytes for
the RAM tier, mlxd's --ssd-cache* for the disk tier).

A memory budget covers the weights, the KV cache and working memory: the KV budget is what is
left after the weights and a headroom for activations (1/16 of the budget, at least 256 MB).
It is also MLX's memory limit, so the buffer cache gives memory back rather than grow past it.
"""

import logging
import os
from pathlib import Path

from mlx_lm.utils import _parse_size

from ..config import ServeConfig
from ..model import ModelLoadError
from ..model.fingerprint import fingerprint
from ..store import PrefixStore
from ..store.ssd import SSDTier

log = logging.getLogger("mlxd.serve")


def total_memory() -> int:
    try:
        import mlx.core as mx

        size = mx.device_info().get("memory_size")
        if size:
            return int(size)
    except Exception:  # noqa: BLE001 - the CPU backend may not report it
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_memory(text: str) -> int:
    """Bytes from "24GB", "24000000000" or "75%" (of the machine's memory); ServeConfig has
    checked the text."""
    text = text.strip()
    if text.endswith("%"):
        return int(total_memory() * float(text[:-1]) / 100)
    return int(_parse_size(text))


def kv_budget_from(config: ServeConfig, weight_bytes: int, adapter_bytes: int = 0) -> int | None:
    """`adapter_bytes`: the LoRA adapters loaded over the model (lora.py) count as weights."""
    budget = config.kv_budget
    if config.memory_budget is not None:
        total = parse_memory(config.memory_budget)
        headroom = max(total // 16, 256 << 20)
        left = total - weight_bytes - adapter_bytes - headroom
        if left <= 0:
            adapters = f", the adapters {adapter_bytes}" if adapter_bytes else ""
            raise ModelLoadError(
                f"--memory-budget {config.memory_budget} ({total} bytes) leaves no room for the "
                f"KV cache: the weights take {weight_bytes} bytes{adapters} and working memory "
                f"{headroom}"
            )
        budget = left if budget is None else min(budget, left)
    return budget


def hold_to_budget(config: ServeConfig) -> int | None:
    """MLX's memory limit at --memory-budget: past it, MLX's allocator frees cached buffers
    before it allocates. Its own default is most of the device (80-95% of a CUDA card), and
    with --prefill-clear-cache off (CUDA's auto) the cache would grow that far. Returns the
    limit it replaced (None: no budget, nothing set)."""
    if config.memory_budget is None:
        return None
    import mlx.core as mx

    return int(mx.set_memory_limit(parse_memory(config.memory_budget)))


def make_store(
    config: ServeConfig, folder: Path, adapter: str | None, kv_budget: int | None = None
) -> tuple[PrefixStore | None, str]:
    """The store and the namespace its entries are keyed by (the model and adapter bytes).
    Without --prompt-cache-bytes, a KV budget (--kv-budget, or what --memory-budget leaves)
    bounds stored and running caches together, as --prompt-cache-bytes would."""
    size = config.prompt_cache_size
    if size <= 0 and not config.ssd_cache:
        return None, ""
    namespace = fingerprint(folder, adapter)
    ssd = None
    if config.ssd_cache:
        root = Path(config.ssd_cache).expanduser()
        ssd = SSDTier(root, int(config.ssd_cache_max), queue_depth=16)
        log.info("disk prompt cache in %s (%d entries found)", root, ssd.stats()["entries"])
    grid = config.prefill_step_size if config.prefix_deterministic else 0
    store = PrefixStore(
        max_bytes=config.prompt_cache_bytes if config.prompt_cache_bytes is not None else kv_budget,
        max_entries=max(size, 0),
        ssd=ssd,
        demote_idle_s=config.ssd_demote_idle,
        grid=grid,
    )
    return store, namespace
