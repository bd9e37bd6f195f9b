"""Where a decode step's GPU time goes, kernel by kernel, on MLX-CUDA: steps run back to back
as BatchGenerator runs them (step n+1 built while n computes), under PyTorch's profiler, whose
CUPTI tracing records every kernel of the process (MLX's included). Per step: the wall time,
the time some kernel ran (GPU busy), the kernel count, and the time by kernel family and by
kernel name. A step whose GPU is idle for much of its wall time is host-bound; one whose busy
time is its wall time is bound by the kernels listed. docs/performance.md §1.

    python -m mlxd.bench.probe_kernels --shape qwen3-0.6b --rows 32 --modes folded+fused

Device only (needs torch with CUDA, as the GPU machine's image has); `summarize` is pure.
"""

import collections
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.step_clock import StepClock

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


def sequence(ks: list[Kernel], steps: int, first: int = 48) -> list[str]:
    """The first `first` kernels of the middle step, in order: one layer's kernels read as a
    list (which matmul is which, what sits between them)."""
    per = len(ks) // steps
    mid = ks[per * (steps // 2) : per * (steps // 2) + first]
    return [f"    {k.dur:8.1f} µs {k.grid:>14}  {k.name[:100]}" for k in mid]


def profile(
    step: Any, steps: int, order: str = "pipelined"
) -> tuple[list[Kernel], float, StepClock]:
    """`steps` steps in `order` (engine/step_order.py: pipelined, each built and queued before
    the last one's result is read; wait, built, the last one read, then queued; split, its
    first layers queued before that read), under torch.profiler; the kernels, the host's wall
    ms a step, and the host's parts of a step as the engine's window times them."""
    import torch.profiler as tp

    clock = StepClock()
    with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
        wall = (
            _threaded(step, steps, clock) if order == "thread" else _run(step, steps, clock, order)
        )
    return exported(prof), wall, clock


def _run(step: Any, steps: int, clock: StepClock, order: str, enc: Any = None) -> float:
    """The steps in `order` (with `enc`, the thread order's encoder); the ms a step."""
    import mlx.core as mx

    from ..engine.step_order import first_layers, split_fraction

    t0 = time.perf_counter()
    prev = step()
    mx.async_eval(prev)
    for _ in range(steps - 1):
        clock.start()
        out = step()
        clock.mark("build")
        first = first_layers(step.cache, split_fraction()) if order in ("split", "thread") else []
        if enc is not None:  # its first layers, the last tokens read, then the rest
            enc.step([prev[1]], prev[1], [out], first)
            clock.mark("wait")
            prev = out
            continue
        if first:  # probe_ops' step_fn hands its caches over as `cache`
            mx.async_eval(*first)
            clock.mark("encode first")
        if order != "pipelined":
            prev[1].tolist()
            clock.mark("wait first")
        mx.async_eval(out)
        clock.mark("encode")
        prev[1].tolist()  # BatchGenerator reads the last step's tokens here
        clock.mark("wait")
        prev = out
    if enc is not None:
        enc.settle()
    prev[1].tolist()
    return (time.perf_counter() - t0) * 1e3 / steps


def _threaded(step: Any, steps: int, clock: StepClock) -> float:
    """The thread order (engine/encoder.py): each step built here on the encoder's stream, the
    last one's tokens read and this one queued on the encoder's thread; the ms a step."""
    import mlx.core as mx

    from ..engine.encoder import StepEncoder, stream

    enc = StepEncoder()
    try:
        with mx.stream(stream()):
            return _run(step, steps, clock, "thread", enc)
    finally:
        enc.close()


def exported(prof: Any) -> list[Kernel]:
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return kernels(json.load(f))


def main(argv: list[str] | None = None) -> None:
    import mlx.core as mx

    from ..model.plain_rows import plain_rows
    from .models import attention_dims, build_random, rows_parser
    from .probe_ops import _mode, _shares, model_for, step_fn

    p = rows_parser(__doc__, "qwen3-0.6b", [32])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--modes", nargs="+", type=_mode, default=["folded+fused"])
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--sequence", type=int, default=0, help="list this many kernels in order")
    p.add_argument(
        "--orders", nargs="+", choices=["pipelined", "wait", "split", "thread"],
        default=["pipelined"],
        help="step orders to profile in turn (wait: the last step read before the next is "
        "queued; split: its first layers queued before that read; thread: read and queued "
        "on a thread of its own while the next is built; engine/step_order.py)",
    )  # fmt: skip
    p.add_argument("--repeat", type=int, default=1, help="profile the orders in turn this often")
    p.add_argument(
        "--fuse", action="store_true",
        help="the mlx mode's step with a lone row's q/k/v and gate/up stacked "
        "(--decode-step rows+fused: model/plain_rows.py)",
    )  # fmt: skip
    args = p.parse_args(argv)
    bm = build_random(args.shape, "bfloat16")
    _, kv, D, _ = attention_dims(args.shape)
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "1")
    for rows in args.rows:
        for mode in args.modes:
            model = model_for(bm.model, mode)
            if args.fuse and mode == "mlx":
                model = plain_rows(bm.model, fuse=True)
            room = len(args.orders) * args.repeat * args.steps + 8
            step = step_fn(model, rows, args.context, kv, D, room, _shares(mode))
            for _ in range(3):  # warm-up: kernels compiled, stacked weights built
                mx.eval(step())
            for _, order in ((r, o) for r in range(args.repeat) for o in args.orders):
                ks, host_wall, clock = profile(step, args.steps, order)
                fused = " (fused)" if args.fuse and mode == "mlx" else ""
                print(
                    f"== {args.shape}, {rows} rows x {args.context} keys, {mode}{fused}, graphs "
                    f"{graphs}, {order}: host wall {host_wall:.3f} ms a step",
                    flush=True,
                )
                print(f"  {clock.line()}", flush=True)
                print("\n".join(summarize(ks, args.steps, args.top)), flush=True)
                if args.sequence:
                    print("\n".join(sequence(ks, args.steps, args.sequence)), flush=True)


if __name__ == "__main__":
    main()
