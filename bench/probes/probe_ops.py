"""What one batched decode step is made of on this device: the primitives of its graph by kind
(views, which launch nothing, apart from the rest) and where its host time goes (building the
graph in Python against building and evaluating it), for mlx-lm's step and mlxd's opt-in modes.
A host-bound step (0.6B on the H200) costs about its primitive count times a per-op cost, so
this is the count to cut. docs/performance.md §1.

    python -m bench.probes.probe_ops --shape qwen3-0.6b --rows 32 --context 4096

On the CPU MLX expands its fast ops (RMSNorm, RoPE, attention) into their fallback graphs, so
the counts there are not the GPU's; run it on the device.
"""

import collections
import contextlib
import io
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from bench.probes.common import attention_dims, rows_parser
from bench.probes.probe_graphs import _caches
from mlxd.bench.models import build_random
from mlxd.kv import step_offsets
from mlxd.model.folded_attention import MODES, for_mode
from mlxd.model.plain_rows import plain_rows

# Primitives that only re-describe their input's memory (no kernel on MLX-CUDA / Metal).
VIEWS = frozenset(
    "Broadcast Reshape Slice Split Transpose ExpandDims Squeeze Flatten Unflatten".split()
)


def primitives(*roots: mx.array) -> collections.Counter:
    """The primitives of the graph behind `roots`, by name (from MLX's DOT export)."""
    out = io.StringIO()
    mx.export_to_dot(out, *roots)
    return collections.Counter(re.findall(r'label ="([A-Za-z0-9_]+)"', out.getvalue()))


def neighbours(kinds: set[str], *roots: mx.array) -> collections.Counter:
    """For each op of `kinds` in the graph behind `roots`: its inputs' producers (`source` for
    an evaluated array) and its output's consumers, as "in, in > KIND > out" (where a
    device-only op comes from: the CPU expands fast ops, so its graph is not the GPU's)."""
    out = io.StringIO()
    mx.export_to_dot(out, *roots)
    label = dict(re.findall(r'\{ (\d+) \[label ="([A-Za-z0-9_]+)"', out.getvalue()))
    edges = re.findall(r'^"?(\w+)"? -> "?(\w+)"?$', out.getvalue(), re.M)
    made_by = {b: a for a, b in edges if a in label}  # array -> the op that produced it
    ins: dict[str, list[str]] = collections.defaultdict(list)  # op -> its input arrays
    used_by: dict[str, list[str]] = collections.defaultdict(list)
    for a, b in edges:
        if b in label:  # array a feeds op b
            ins[b].append(a)
            used_by[a].append(label[b])

    def origin(a: str) -> str:  # an input through its views: "Broadcast/Full", "Slice/source"
        op = made_by.get(a)
        if op is None:
            return "source"
        if label[op] in VIEWS and len(ins[op]) == 1:
            return f"{label[op]}/{origin(ins[op][0])}"
        return label[op]

    found: collections.Counter = collections.Counter()
    for op, kind in label.items():
        if kind in kinds:
            after = sorted(k for a, b in edges if a == op for k in used_by[b])
            found[
                f"{', '.join(map(origin, ins[op]))} > {kind} > {', '.join(after) or 'output'}"
            ] += 1
    return found


def step_fn(
    model: Any, rows: int, context: int, kv: int, D: int, room: int, share: bool = True
) -> Callable[[], Any]:
    """A greedy batched step over `rows` rows of `context` cached tokens (probe_graphs' caches:
    left padding varied, `room` free slots, so no step grows them): logprobs and tokens, as
    BatchGenerator's step computes them; `share`: the layers' offsets then share one add, as
    mlxd's step leaves them (kv/step_offsets.py)."""
    cache = _caches(model, rows, context, kv, D, room)
    tokens = mx.zeros((rows, 1), mx.int32)

    def step() -> tuple[mx.array, mx.array]:
        before = step_offsets.offsets(cache)
        logits = model(tokens, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if share:
            step_offsets.share(cache, before)
        return logprobs, mx.argmax(logprobs, axis=-1)

    step.cache = cache  # type: ignore[attr-defined]  # probe_kernels' split order reads it
    return step


def measure(
    step: Callable[[], tuple[mx.array, mx.array]], steps: int
) -> tuple[float, float, float]:
    """Median ms to build one step's graph, to build and encode it (until `mx.async_eval`
    returns: the host's whole share), and to build and evaluate it."""
    build, host, whole = [], [], []
    for _ in range(steps):
        mx.synchronize()
        t0 = time.perf_counter()
        out = step()
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.eval(out)
        build.append(t1 - t0)
        host.append(t2 - t0)
        whole.append(time.perf_counter() - t0)
    return tuple(1e3 * statistics.median(t) for t in (build, host, whole))  # type: ignore[return-value]


def report(mode: str, counts: collections.Counter, build: float, host: float, whole: float) -> str:
    views = sum(n for p, n in counts.items() if p in VIEWS)
    ops = sum(counts.values()) - views
    top = ", ".join(f"{p} {n}" for p, n in counts.most_common() if p not in VIEWS)
    return (
        f"{mode:17} ops {ops:5d} views {views:5d} | build {build:6.2f} ms, +encode "
        f"{host:6.2f} ms, build+eval {whole:6.2f} ms | {top}"
    )


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [32])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    here = list(MODES)
    p.add_argument(
        "--modes", nargs="+", type=_mode, default=here, metavar="MODE[@PARTS]",
        help=f"{', '.join(MODES)}; a +gemv mode may name its parts after @ (MLXD_GEMV_PARTS, "
        "e.g. folded+fused+gemv@qkv,o,gate_up,down,qk), so part sets alternate in one process; "
        f"a mode may end in {THREE_D} (mlx-lm's 3-D step, before model/rows_step.py and, for "
        f"mlx, model/plain_rows.py) and/or {PER_LAYER} (an offset add in every layer, as "
        "mlx-lm's step leaves)",
    )  # fmt: skip
    p.add_argument(
        "--alternate", type=int, default=0, metavar="BLOCKS",
        help="time the modes in turn, BLOCKS blocks of --steps steps each, and report each "
        "mode's median against the first mode's, block by block (a host whose speed moves "
        "by the minute)",
    )  # fmt: skip
    p.add_argument(
        "--neighbours", nargs="+", default=[], metavar="KIND",
        help="also list, for ops of these kinds, their inputs' producers and output's consumers",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.alternate:
        return alternate(args)
    bm = build_random(args.shape, "bfloat16")
    _, kv, D, _ = attention_dims(args.shape)
    for rows in args.rows:
        print(f"{args.shape}, {rows} rows x {args.context} keys, {mx.default_device()}")
        for mode in args.modes:
            model = model_for(bm.model, mode)
            step = step_fn(model, rows, args.context, kv, D, args.steps + 2, _shares(mode))
            mx.eval(step())  # warm-up: kernels compiled, the fused mode's stacked weights
            counts = primitives(*step())  # a steady step's graph (built, then evaluated below)
            mx.eval(step())
            print(report(mode, counts, *measure(step, args.steps)), flush=True)
            if args.neighbours:
                found = neighbours(set(args.neighbours), *step())
                mx.eval(step())
                for line, n in found.most_common():
                    print(f"    {n:4d}  {line}")


# --modes suffixes: the step with mlx-lm's offset add in every layer (kv/step_offsets.py off);
# the 3-D step (model/rows_step.py, or model/plain_rows.py for mlx, off). Either, in this order.
PER_LAYER = "/per-layer-offsets"
THREE_D = "/3d"


def _parse(spec: str) -> tuple[str, str, bool, bool]:
    """MODE[@PARTS][/3d][/per-layer-offsets] -> (mode, parts, shares offsets, rows step)."""
    rest = spec.removesuffix(PER_LAYER)
    base = rest.removesuffix(THREE_D)
    mode, _, parts = base.partition("@")
    return mode, parts, rest == spec, base == rest


def _mode(spec: str) -> str:
    mode, parts, _, _ = _parse(spec)
    if mode not in MODES or (parts and not mode.endswith("+gemv")):
        raise ValueError(spec)  # argparse's "invalid _mode value"
    return spec


def model_for(model: Any, spec: str) -> Any:
    """The model of a --modes entry: MODE, or a +gemv MODE@PARTS built with those parts, with
    THREE_D its 3-D step (PER_LAYER changes the step, not the model: `step_fn`'s share)."""
    mode, parts, _, rows = _parse(spec)
    return _with_parts(model, mode, parts, rows)


def _shares(spec: str) -> bool:
    return _parse(spec)[2]


def _with_parts(model: Any, mode: str, parts: str, rows: bool) -> Any:
    if mode == "mlx":  # mlxd's mlx-mode step over rows (model/plain_rows.py); /3d: mlx-lm's
        return plain_rows(model) if rows else model
    if not parts:
        return for_mode(model, mode, rows)
    with _env("MLXD_GEMV_PARTS", parts):  # read once, when the shadow model is built
        return for_mode(model, mode, rows)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` inside, as it was after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def alternate(args: Any) -> None:
    """Each mode's step, timed in blocks taken in turn; per-block ratios to the first mode."""
    bm = build_random(args.shape, "bfloat16")
    _, kv, D, _ = attention_dims(args.shape)
    room = args.alternate * args.steps + 4
    for rows in args.rows:
        steps = [
            step_fn(model_for(bm.model, m), rows, args.context, kv, D, room, _shares(m))
            for m in args.modes
        ]
        for step in steps:
            mx.eval(step())
        whole: list[list[float]] = [[] for _ in steps]
        for _ in range(args.alternate):
            for i, step in enumerate(steps):
                whole[i].append(measure(step, args.steps)[2])
        base = whole[0]
        print(f"{args.shape}, {rows} rows x {args.context} keys, {args.alternate} blocks")
        for mode, w in zip(args.modes, whole, strict=True):
            ratios = sorted(b / a for a, b in zip(base, w, strict=True))
            print(
                f"{mode:17} whole step {statistics.median(w):6.2f} ms [{min(w):.2f}-{max(w):.2f}]"
                f" | against {args.modes[0]}: {statistics.median(ratios):.3f}x "
                f"[{ratios[0]:.3f}-{ratios[-1]:.3f}]",
                flush=True,
            )


if __name__ == "__main__":
    main()
