"""The prompt store a served model gets from the flags: mlx_lm.server's --prompt-cache-size and
--prompt-cache-bytes for the RAM tier, mlxd's --ssd-cache* for the disk tier."""

import logging
from pathlib import Path
from typing import Any

from ..model.fingerprint import fingerprint
from ..store import PrefixStore
from ..store.ssd import SSDTier

log = logging.getLogger("mlxd.serve")


def make_store(
    args: Any, folder: Path, adapter: str | None, kv_budget: int | None = None
) -> tuple[PrefixStore | None, str]:
    """The store and the namespace its entries are keyed by (the model and adapter bytes).
    Without --prompt-cache-bytes, a KV budget (--kv-budget, or what --memory-budget leaves)
    bounds stored and running caches together, as --prompt-cache-bytes would."""
    size = getattr(args, "prompt_cache_size", 10)
    if size <= 0 and not getattr(args, "ssd_cache", None):
        return None, ""
    namespace = fingerprint(folder, adapter)
    ssd = None
    if getattr(args, "ssd_cache", None):
        root = Path(args.ssd_cache).expanduser()
        ssd = SSDTier(root, int(args.ssd_cache_max), queue_depth=16)
        log.info("disk prompt cache in %s (%d entries found)", root, ssd.stats()["entries"])
    grid = args.prefill_step_size if getattr(args, "prefix_deterministic", False) else 0
    store = PrefixStore(
        max_bytes=args.prompt_cache_bytes if args.prompt_cache_bytes is not None else kv_budget,
        max_entries=max(size, 0),
        ssd=ssd,
        demote_idle_s=getattr(args, "ssd_demote_idle", None),
        grid=grid,
    )
    return store, namespace
