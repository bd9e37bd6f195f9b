"""Where a decode step's GPU time goes, kernel by kernel, on MLX-CUDA: steps run back to back
as BatchGenerator runs them (step n+1 built while n computes), under PyTorch's profiler, whose
CUPTI tracing records every kernel of the process (MLX's included). Per step: the wall time,
the time some kernel ran (GPU busy), the kernel count, and the time by kernel family and by
kernel name. A step whose GPU is idle for much of its wall time is host-bound; one whose busy
time is its wall time is bound by the kernels listed. docs/performance.md §1.

    python -m bench.probes.probe_kernels --shape qwen3-0.6b --rows 32 --modes folded+fused

Device only (needs torch with CUDA, as the GPU machine's image has). The trace reading
(`kernels`, `summarize`) is mlxd/engine/kernel_profile.py's, shared with the engine's kernel
window (MLXD_KERNELS).
"""

import json
import os
import tempfile
import time
from typing import Any

from mlxd.engine.kernel_profile import Kernel, kernels, summarize
from mlxd.engine.kernel_window import StepClock


def sequence(ks: list[Kernel], steps: int, first: int = 48) -> list[str]:
    """The first `first` kernels of the middle step, in order: one layer's kernels read as a
    list (which matmul is which, what sits between them)."""
    per = len(ks) // steps
    mid = ks[per * (steps // 2) : per * (steps // 2) + first]
    return [f"    {k.dur:8.1f} µs {k.grid:>14}  {k.name[:100]}" for k in mid]


def profile(
    step: Any, steps: int, order: str = "pipelined"
) -> tuple[list[Kernel], float, StepClock]:
    """`steps` steps in `order` (engine/overlap.py: pipelined, each built and queued before
    the last one's result is read; thread, read and queued on a thread of its own), under
    torch.profiler; the kernels, the host's wall ms a step, and the host's parts of a step as
    the engine's window times them."""
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

    from mlxd.engine.overlap import FIRST_LAYERS, first_layers

    t0 = time.perf_counter()
    prev = step()
    mx.async_eval(prev)
    for _ in range(steps - 1):
        clock.start()
        out = step()
        clock.mark("build")
        if enc is not None:  # its first layers, the last tokens read, then the rest
            first = first_layers(step.cache, FIRST_LAYERS)  # probe_ops' step_fn: its `cache`
            enc.step([prev[1]], prev[1], [out], first)
            clock.mark("wait")
            prev = out
            continue
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
    """The thread order (engine/overlap.py): each step built here on the encoder's stream, the
    last one's tokens read and this one queued on the encoder's thread; the ms a step."""
    import mlx.core as mx

    from mlxd.engine.overlap import StepEncoder, stream

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

    from bench.probes.common import attention_dims, rows_parser
    from bench.probes.probe_ops import _mode, _shares, model_for, step_fn
    from mlxd.bench.models import build_random
    from mlxd.model.plain_rows import plain_rows

    p = rows_parser(__doc__, "qwen3-0.6b", [32])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--modes", nargs="+", type=_mode, default=["folded+fused"])
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--sequence", type=int, default=0, help="list this many kernels in order")
    p.add_argument(
        "--orders", nargs="+", choices=["pipelined", "thread"], default=["pipelined"],
        help="step orders to profile in turn (thread: read and queued on a thread of its own "
        "while the next is built; engine/overlap.py)",
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
