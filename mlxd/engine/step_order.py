"""When a batched decode step is queued against the last one (`--step-order`; the
MLXD_STEP_ORDER environment variable gives the default, for the device scripts' A/Bs).

- `pipelined` (default, mlx-lm's): step n+1 is queued, then step n's tokens are read.
- `wait`: step n's tokens are read first. MLX writes a KV slot in place only if no queued
  kernel still holds the layer's buffer; queued a step ahead, a write can copy the whole layer
  (~270 MB at 32 rows x 4k, docs/performance.md §1). Waiting leaves the GPU idle until the new
  step's first kernels are encoded.
- `split`: the first MLXD_STEP_SPLIT (default 1/3) of the layers are queued before the read,
  the rest after. Step n is by then past its first layers, so their writes are in place, and
  the GPU has them to run while the rest is encoded.
- `thread`: split's order, but on a thread of its own (encoder.py): it queues step n+1's first
  layers, reads step n's tokens, then queues the rest while the engine thread emits them and
  builds step n+2.
The graph is the same in every order: the same bits. On an H100, 32 agents on a 0.6B model
(host-bound: GPU busy 56% of a pipelined step), split decoded 1.024-1.067x faster in three of
three fleet rounds (docs/performance.md, session 43); GPU-bound steps were not measured."""

import math
import os
from typing import Any

import mlx.core as mx

ORDERS = ("pipelined", "wait", "split", "thread")
THREAD_ROWS = 16  # the thread order's floor by default (thread_rows below)


def order(value: str | None = None) -> str | None:
    """`value` (the flag's), else MLXD_STEP_ORDER, checked; None when neither is set."""
    value = value or os.environ.get("MLXD_STEP_ORDER")
    if value is not None and value not in ORDERS:
        raise ValueError(f"step order {value!r}: one of {', '.join(ORDERS)}")
    return value


def resolved(value: str | None = None) -> str:
    """`order(value)`, else the machine's default: `thread` on CUDA (session 44: it beat split
    and pipelined at 8 and 32 agents on both shapes), mlx-lm's `pipelined` elsewhere (Metal and
    the CPU are not measured). Asks MLX for CUDA: call it after `--cuda-graphs` is applied."""
    return order(value) or ("thread" if mx.cuda.is_available() else "pipelined")


def split_fraction() -> float:
    value = os.environ.get("MLXD_STEP_SPLIT", "0.33")
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(f"MLXD_STEP_SPLIT={value!r}: a fraction of the layers, in (0, 1]")
    return fraction


def thread_rows() -> int:
    """MLXD_THREAD_ROWS (default 16): the fewest rows whose steps the thread order hands to its
    encoder; smaller batches step in the pipelined order on the engine thread. On an H100 the
    encoder won at 32 rows on both shapes and lost at 8 (session 44: its extra GIL hand-offs)."""
    value = os.environ.get("MLXD_THREAD_ROWS", str(THREAD_ROWS))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"MLXD_THREAD_ROWS={value!r}: a row count, 1 or more")
    return int(value)


def first_layers(caches: list[Any], fraction: float) -> list[mx.array]:
    """The KV buffers the first `fraction` of the layers write this step: queuing them queues
    those layers' whole work (and the next layer's projections up to its write)."""
    n = min(len(caches), max(1, math.ceil(len(caches) * fraction)))
    arrays = (getattr(c, name, None) for c in caches[:n] for name in ("keys", "values"))
    return [a for a in arrays if isinstance(a, mx.array)]
