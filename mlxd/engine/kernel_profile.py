"""A CUDA kernel trace read as a decode step's GPU time: the kernel events of a Chrome trace
(PyTorch's `export_chrome_trace`, whose CUPTI tracing records MLX's kernels too), the time some
kernel ran, and per-step lines by kernel family and by kernel name. Pure: no torch, no MLX.

The engine's kernel window (kernel_window.py, MLXD_KERNELS) writes these lines for a window of
a running fleet's turns; bench/probes/probe_kernels.py for a step run alone.
"""

import collections
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Kernel families by name, first match wins (cuBLASLt's kernels carry sm90_xmma / gemm names;
# MLX's own are named by op).
FAMILIES = [
    ("gemv", r"gemv"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|cublas|matmul|gather_mm"),
    ("sdpa", r"sdpa|flash|attention|cudnn"),
    ("softmax", r"softmax|logsumexp"),
    ("norm", r"rms|layer_norm"),
    ("rope", r"rope"),
    ("copy", r"copy|concat|slice_update|scatter|gather"),
    ("reduce", r"reduce|arg_|argmax|all_reduce|row_reduce|col_reduce"),
    ("compiled", r"compiled|fused"),
    ("elementwise", r"binary|unary|ternary|select|add|multiply"),
]


BIG_COPY_US = 50.0  # a KV write in place is a few µs; a whole layer at 32 rows x 4k, ~190


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, pattern in FAMILIES if re.search(pattern, low)), "other")


@dataclass
class Kernel:
    name: str
    start: float  # µs
    dur: float  # µs
    grid: str = ""


def kernels(trace: dict[str, Any]) -> list[Kernel]:
    """The kernel events of a Chrome trace (PyTorch's `export_chrome_trace`), by start time."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel" and "dur" in e:
            grid = e.get("args", {}).get("grid", "")
            out.append(Kernel(e["name"], float(e["ts"]), float(e["dur"]), str(grid)))
    return sorted(out, key=lambda k: k.start)


def busy(ks: Iterable[Kernel]) -> float:
    """µs during which at least one kernel ran (the union of their intervals)."""
    total, end = 0.0, float("-inf")
    for k in sorted(ks, key=lambda k: k.start):
        stop = k.start + k.dur
        if stop > end:
            total += stop - max(k.start, end)
            end = stop
    return total


def summarize(ks: list[Kernel], steps: int, top: int = 20) -> list[str]:
    """Per-step lines: wall, busy, kernels; by family; the `top` kernel names by time."""
    if not ks:
        return ["no kernels recorded (CUPTI saw nothing: is this MLX-CUDA?)"]
    wall = (max(k.start + k.dur for k in ks) - ks[0].start) / steps
    on = busy(ks) / steps
    lines = [
        f"per step: wall {wall / 1e3:7.3f} ms, GPU busy {on / 1e3:7.3f} ms "
        f"({100 * on / wall:5.1f}%), idle {(wall - on) / 1e3:6.3f} ms, "
        f"{len(ks) / steps:6.1f} kernels, {on / max(len(ks) / steps, 1):6.1f} µs a kernel"
    ]
    by_family: dict[str, list[float]] = collections.defaultdict(list)
    by_name: dict[str, list[Kernel]] = collections.defaultdict(list)
    for k in ks:
        by_family[family(k.name)].append(k.dur)
        by_name[k.name].append(k)
    lines.append("  by family (ms a step, kernels a step, median µs):")
    for f, durs in sorted(by_family.items(), key=lambda x: -sum(x[1])):
        lines.append(
            f"    {f:12} {sum(durs) / steps / 1e3:7.3f} ms  {len(durs) / steps:6.1f}  "
            f"{statistics.median(durs):8.1f} µs"
        )
    big = [k for k in ks if family(k.name) == "copy" and k.dur >= BIG_COPY_US]
    # The race copies a few layers in most steps; a cache's growth (every 256 steps) copies
    # every layer once: which steps they fall in tells the two apart.
    t0, span = ks[0].start, max(k.start + k.dur for k in ks) - ks[0].start
    hit = {min(int((k.start - t0) * steps / span), steps - 1) for k in big} if span else set()
    lines.append(
        f"  copies of {BIG_COPY_US:.0f} µs or more (whole-layer KV copies: the donation race): "
        f"{len(big) / steps:.1f} a step, {sum(k.dur for k in big) / steps / 1e3:.3f} ms, "
        f"in {len(hit)} of {steps} step-long spans"
    )
    lines.append(f"  top {top} kernels (ms a step, count a step, median µs, grid):")
    ranked = sorted(by_name.items(), key=lambda x: -sum(k.dur for k in x[1]))
    for name, group in ranked[:top]:
        durs = [k.dur for k in group]
        lines.append(
            f"    {sum(durs) / steps / 1e3:7.3f} ms {len(durs) / steps:6.1f} "
            f"{statistics.median(durs):8.1f} µs {group[0].grid:>14}  {name[:110]}"
        )
    return lines
