"""Does the decode step's speed depend on the CPU that launches it? The same batched step (and a
one-row step) timed with the calling thread pinned to each CPU in turn, in several passes: a
host-bound step that runs fast on some CPUs and slow on others (the GPU's NUMA node, a busy
SMT sibling) shows up as a per-CPU split that repeats across passes, where a split by stretch
of time moves between passes. docs/performance.md §1.

    python -m bench.probes.probe_cores --shape qwen3-0.6b --rows 1 32 --context 4096
"""

import os
import statistics
import threading
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from bench.probes.common import attention_dims, rows_parser
from bench.probes.probe_attention import timed
from bench.probes.probe_ops import step_fn
from mlxd.bench.models import build_random
from mlxd.model.folded_attention import for_mode


def sweep(steps: dict[int, Callable[[], Any]], cpus: list[int], passes: int, n: int) -> dict:
    """{(rows, cpu): [median ms per pass]}, the calling thread pinned to one CPU at a time."""
    out: dict[tuple[int, int], list[float]] = {}
    everyone = os.sched_getaffinity(0)
    try:
        for _ in range(passes):
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})  # this thread only (Linux: pid 0 is the caller)
                for rows, step in steps.items():
                    out.setdefault((rows, cpu), []).append(timed(step, n))
    finally:
        os.sched_setaffinity(0, everyone)
    return out


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [1, 32])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=15, help="timed steps per CPU, per pass")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--mode", choices=("mlx", "folded+fused"), default="folded+fused")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    bm = build_random(args.shape, "bfloat16")
    _, kv, D, _ = attention_dims(args.shape)
    fused = for_mode(bm.model, args.mode)
    room = len(cpus) * args.passes * (args.steps + 3) + 8
    steps = {
        rows: step_fn(bm.model if rows == 1 else fused, rows, args.context, kv, D, room)
        for rows in args.rows
    }
    print(f"{args.shape}, {args.context} keys, {mx.default_device()}, CPUs {cpus}, "
          f"thread {threading.get_native_id()}", flush=True)  # fmt: skip
    for step in steps.values():
        mx.eval(step())
    result = sweep(steps, cpus, args.passes, args.steps)
    for rows in args.rows:
        row = [(cpu, result[(rows, cpu)]) for cpu in cpus]
        print(f"{rows} rows: median ms per CPU (pass by pass)")
        for cpu, ms in row:
            print(f"  cpu {cpu:3d}: " + " ".join(f"{m:7.2f}" for m in ms))
        best = min(statistics.median(ms) for _, ms in row)
        worst = max(statistics.median(ms) for _, ms in row)
        print(f"  fastest CPU {best:.2f} ms, slowest {worst:.2f} ms ({worst / best:.2f}x)")


if __name__ == "__main__":
    main()
