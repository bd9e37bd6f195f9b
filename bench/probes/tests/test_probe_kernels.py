"""probe_kernels' reading of a profiler trace (the profiling itself needs torch on MLX-CUDA)."""

from bench.probes.probe_kernels import sequence
from mlxd.engine.kernel_profile import Kernel, busy, family, kernels, summarize
from mlxd.engine.kernel_window import StepClock


def _trace() -> dict:
    grid = {"grid": [4, 1, 1]}
    ev = [  # two steps of three kernels; the gemv overlaps the gemm by 5 µs
        {"cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 0, "dur": 20, "args": grid},
        {"cat": "kernel", "name": "gemv_batched", "ts": 15, "dur": 10},
        {"cat": "kernel", "name": "rms_norm_kernel", "ts": 40, "dur": 10},
        {"cat": "cpu_op", "name": "ignored", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 100, "dur": 30},
        {"cat": "kernel", "name": "gemv_batched", "ts": 130, "dur": 10},
        {"cat": "kernel", "name": "rms_norm_kernel", "ts": 190, "dur": 10},
    ]  # fmt: skip
    return {"traceEvents": ev}


def test_kernels_keep_only_kernel_events_in_start_order() -> None:
    ks = kernels(_trace())
    assert [k.start for k in ks] == [0, 15, 40, 100, 130, 190]
    assert ks[0].grid == "[4, 1, 1]" and ks[1].grid == ""


def test_busy_is_the_union_of_intervals() -> None:
    assert busy([Kernel("a", 0, 20), Kernel("b", 15, 10), Kernel("c", 40, 10)]) == 35
    assert busy([Kernel("a", 0, 100), Kernel("b", 10, 10)]) == 100
    assert busy([]) == 0


def test_families_by_name() -> None:
    assert family("sm90_xmma_gemm_bf16bf16_tn") == "matmul"
    assert family("gemv_batched<bf16>") == "gemv"
    assert family("rms_norm_kernel") == "norm"
    assert family("cudnn_sdpa_fprop") == "sdpa"
    assert family("mystery") == "other"


def test_summary_per_step_figures() -> None:
    lines = summarize(kernels(_trace()), steps=2)
    # wall (200 - 0) / 2 = 100 µs; busy (35 + 30 + 10 + 10) / 2 = 42.5 µs; 3 kernels a step
    assert lines[0].startswith("per step: wall   0.100 ms, GPU busy   0.043 ms ( 42.5%)")
    assert "3.0 kernels" in lines[0]
    fam = {line.split()[0]: line.split()[1] for line in lines[2:5]}
    assert fam == {"matmul": "0.025", "gemv": "0.010", "norm": "0.010"}
    assert lines[5] == (
        "  copies of 50 µs or more (whole-layer KV copies: the donation race): 0.0 a step, "
        "0.000 ms, in 0 of 2 step-long spans"
    )
    assert lines[7].split()[0] == "0.025" and lines[7].endswith("sm90_xmma_gemm_bf16")
    assert summarize([], 1) == ["no kernels recorded (CUPTI saw nothing: is this MLX-CUDA?)"]


def test_sequence_lists_the_middle_steps_kernels_in_order() -> None:
    lines = sequence(kernels(_trace()), steps=2, first=2)
    assert "30.0 µs" in lines[0] and lines[0].endswith("sm90_xmma_gemm_bf16")
    assert lines[1].endswith("gemv_batched")


def test_main_profiles_each_order_and_names_the_fused_lone_step(monkeypatch, capsys) -> None:
    """main's loop on the CPU with the profiler replaced (torch is the device's): each order in
    turn per mode, the step's steps handed over, and --fuse naming the mlx mode's stacked step."""
    from bench.probes import probe_kernels

    seen: list[tuple[int, bool]] = []

    def fake(step, steps, order="pipelined"):
        logprobs, tokens = step()  # the probe's real step builds and runs here
        assert tokens.shape == (1,)
        seen.append((steps, order))
        clock = StepClock()
        clock.start()
        clock.mark("build")
        return [Kernel("gemv_single", 0, 5), Kernel("rms_norm", 10, 5)], 1.0, clock

    monkeypatch.setattr(probe_kernels, "profile", fake)
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)  # read for the header: "graphs 1"
    argv = "--shape qwen3-host --rows 1 --context 32 --steps 3 --modes mlx --fuse"
    probe_kernels.main([*argv.split(), "--orders", "pipelined", "thread"])
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line.startswith("==")]
    head = "== qwen3-host, 1 rows x 32 keys, mlx (fused), graphs 1"
    assert heads == [
        f"{head}, pipelined: host wall 1.000 ms a step",
        f"{head}, thread: host wall 1.000 ms a step",
    ]
    assert seen == [(3, "pipelined"), (3, "thread")]
    assert any(line.startswith("per step: wall   0.005 ms") for line in out)
    assert sum(line.startswith("  host ms a step (1 steps): build ") for line in out) == 2


def test_profile_times_the_host_parts_of_each_order(monkeypatch) -> None:
    """profile's own loop on the CPU, torch.profiler replaced by a stand-in (CUPTI is the
    device's): the steps after the first are timed by part, in the engine's order."""
    import json
    import sys
    import types

    import mlx.core as mx

    from bench.probes import probe_kernels

    class Prof:
        def __init__(self, activities=None) -> None:
            pass

        def __enter__(self) -> "Prof":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def export_chrome_trace(self, path: str) -> None:
            ev = [{"cat": "kernel", "name": "gemv", "ts": 0, "dur": 5}]
            with open(path, "w") as f:
                json.dump({"traceEvents": ev}, f)

    fake = types.ModuleType("torch.profiler")
    fake.profile, fake.ProfilerActivity = Prof, types.SimpleNamespace(CUDA="cuda")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.profiler", fake)
    calls = []

    def step():
        calls.append(1)
        x = mx.ones((2, 2)) * len(calls)
        return x, x.sum(axis=-1)

    step.cache = [types.SimpleNamespace(keys=mx.ones(2), values=mx.ones(2)) for _ in range(3)]
    ks, wall, clock = probe_kernels.profile(step, 4, "pipelined")
    assert [k.name for k in ks] == ["gemv"] and wall > 0
    assert clock.steps == 3 and list(clock.sums) == ["build", "encode", "wait"]


def test_the_big_copies_are_counted_apart() -> None:
    ks = [Kernel("copy_v<bf16>", 0, 186), Kernel("copy_gg_nd<bf16>", 200, 3)]
    ks.append(Kernel("gemm", 300, 9))
    (line,) = [x for x in summarize(ks, steps=2) if x.startswith("  copies of 50")]
    assert line.endswith("0.5 a step, 0.093 ms, in 1 of 2 step-long spans")  # the 186 µs one


def test_big_copies_are_placed_in_step_long_spans() -> None:
    """Copies spread over the steps (the race) against all in one step (a cache's growth)."""
    gemm = [Kernel("nvjet_gemm", t, 10) for t in (0, 100, 200, 390)]
    spread = [Kernel("copy_v", t, 60) for t in (20, 120, 220, 320)]
    lumped = [Kernel("copy_v", t, 15) for t in (10, 30, 50, 70)]  # 15 µs: under the bar
    big = [Kernel("copy_v", t, 60) for t in (110, 180)]  # both in the second 100 µs span
    for copies, tail in ((spread, "1.0 a step, 0.060 ms, in 4 of 4"), (lumped + big, "in 1 of 4")):
        ks = sorted(gemm + copies, key=lambda k: k.start)
        (line,) = [x for x in summarize(ks, 4) if "copies" in x]
        assert line.endswith(tail + " step-long spans"), line


def test_the_thread_order_steps_the_probe_on_the_encoders_thread() -> None:
    """probe_kernels' thread order (engine/overlap.py) runs the probe's own steps: the same
    logprobs, step by step, as the steps evaluated in turn here, and the host's parts timed."""
    import mlx.core as mx

    from bench.probes import probe_kernels
    from bench.probes.common import attention_dims
    from bench.probes.probe_ops import model_for, step_fn
    from mlxd.bench.models import build_random

    bm = build_random("qwen3-host", "bfloat16")
    _, kv, D, _ = attention_dims("qwen3-host")
    outs: dict[str, list] = {}
    for name in ("in turn", "thread"):
        mx.random.seed(3)  # the same random caches for both
        step = step_fn(model_for(bm.model, "folded+fused"), 2, 32, kv, D, 16)
        got: list = []

        def recorded(step=step, got=got):
            got.append(step())
            return got[-1]

        recorded.cache = step.cache  # type: ignore[attr-defined]  # its first layers go first
        if name == "thread":
            clock = StepClock()
            assert probe_kernels._threaded(recorded, 4, clock) > 0
            assert "build" in clock.line() and "wait" in clock.line()
        else:
            for _ in range(4):
                mx.eval(recorded())
        outs[name] = got
    assert len(outs["thread"]) == 4
    pairs = zip(outs["in turn"], outs["thread"], strict=True)
    assert all(mx.array_equal(a[0], b[0]).item() for a, b in pairs)
