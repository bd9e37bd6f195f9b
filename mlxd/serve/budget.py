"""`--kv-budget` and `--memory-budget`: how many bytes of KV cache the running rows may hold.

A memory budget covers the weights, the KV cache and working memory: the KV budget is what is
left after the weights and a headroom for activations (1/16 of the budget, at least 256 MB).
It is also MLX's memory limit, so the buffer cache gives memory back rather than grow past it.
"""

import os
from typing import Any

from mlx_lm.utils import _parse_size

from ..model import ModelLoadError


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
    """Bytes from "24GB", "24000000000" or "75%" (of the machine's memory)."""
    text = text.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError as e:
            raise ModelLoadError(f"--memory-budget: '{text}' is not a percentage") from e
        if not 0 < pct <= 100:
            raise ModelLoadError("--memory-budget: a percentage must be in (0, 100]")
        return int(total_memory() * pct / 100)
    try:
        return int(_parse_size(text))
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"--memory-budget: cannot read '{text}' as a size") from e


def kv_budget_from(args: Any, weight_bytes: int) -> int | None:
    budget = args.kv_budget
    if args.memory_budget is not None:
        total = parse_memory(args.memory_budget)
        headroom = max(total // 16, 256 << 20)
        left = total - weight_bytes - headroom
        if left <= 0:
            raise ModelLoadError(
                f"--memory-budget {args.memory_budget} ({total} bytes) leaves no room for the KV "
                f"cache: the weights take {weight_bytes} bytes and working memory {headroom}"
            )
        budget = left if budget is None else min(budget, left)
    return budget


def hold_to_budget(args: Any) -> int | None:
    """MLX's memory limit at --memory-budget: past it, MLX's allocator frees cached buffers
    before it allocates. Its own default is most of the device (80-95% of a CUDA card), and
    with --prefill-clear-cache off (CUDA's auto) the cache would grow that far. Returns the
    limit it replaced (None: no budget, nothing set)."""
    if args.memory_budget is None:
        return None
    import mlx.core as mx

    return int(mx.set_memory_limit(parse_memory(args.memory_budget)))
