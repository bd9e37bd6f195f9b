"""MLXD_KERNELS' window over the engine's turns (the profiler is a stand-in: CUPTI needs a GPU)."""

import json
from pathlib import Path

import pytest

from mlxd.engine.kernel_window import KernelWindow, NoWindow


class FakeProfiler:
    def __init__(self) -> None:
        self.entered = self.exited = 0

    def __enter__(self) -> "FakeProfiler":
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited += 1

    def export_chrome_trace(self, path: str) -> None:
        # Two turns of 1,000 µs: a 600 µs matmul, and one whole-layer copy in the second.
        ev = [
            {"cat": "kernel", "name": "nvjet_gemm", "ts": 0, "dur": 600},
            {"cat": "kernel", "name": "nvjet_gemm", "ts": 1000, "dur": 600},
            {"cat": "kernel", "name": "copy_v", "ts": 1700, "dur": 200},
            {"cat": "cpu_op", "name": "host", "ts": 0, "dur": 2000},
        ]
        Path(path).write_text(json.dumps({"traceEvents": ev}))


def _window(tmp_path: Path, start: int = 2, turns: int = 2) -> tuple[KernelWindow, FakeProfiler]:
    prof = FakeProfiler()
    return KernelWindow(str(tmp_path / "k.txt"), 4, start, turns, profiler=prof), prof


def test_window_opens_at_the_start_th_full_turn_and_closes_after_its_turns(tmp_path: Path) -> None:
    w, prof = _window(tmp_path)
    for rows in [1, 4, 3]:  # one turn of 4 rows seen; turns below 4 rows do not count
        w.turn(rows)
    assert prof.entered == 0
    w.turn(4)  # the 2nd turn of 4 rows: the window opens after it
    assert prof.entered == 1 and prof.exited == 0
    w.turn(5)
    assert prof.exited == 0
    w.turn(4)  # 2 turns profiled: closed
    assert prof.exited == 1 and w.done
    w.turn(4)
    w.turn(4)
    assert prof.entered == 1  # one window a process
    text = (tmp_path / "k.txt").read_text()
    assert "2 turns of >= 4 rows from the 2-th" in text
    # wall (1,900 µs span) / 2 = 0.950 ms; busy 1,400 / 2 = 0.700 ms; one copy over 2 turns.
    assert "wall   0.950 ms, GPU busy   0.700 ms" in text
    assert "0.5 a step, 0.100 ms" in text


def test_window_closes_early_when_rows_fall(tmp_path: Path) -> None:
    w, prof = _window(tmp_path, start=1, turns=10)
    w.turn(4)
    w.turn(4)
    w.turn(2)
    assert prof.exited == 1
    assert "1 turns of >= 4 rows" in (tmp_path / "k.txt").read_text()


def test_a_failed_summary_is_written_not_raised(tmp_path: Path) -> None:
    w, prof = _window(tmp_path, start=1, turns=1)

    def broken(path: str) -> None:
        raise RuntimeError("no trace")

    prof.export_chrome_trace = broken  # type: ignore[method-assign]
    w.turn(4)
    w.turn(4)
    assert "no summary: RuntimeError('no trace')" in (tmp_path / "k.txt").read_text()


def test_the_config_opens_the_window(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from mlxd.config import EngineConfig, from_env

    assert type(KernelWindow.of(None, "32 60 40")) is NoWindow
    monkeypatch.setattr("mlxd.engine.kernel_window._cupti", FakeProfiler)
    env = {"MLXD_KERNELS": str(tmp_path / "k.txt"), "MLXD_KERNELS_AT": "8 3 5"}
    config = from_env(EngineConfig(), env)
    w = KernelWindow.of(config.kernels, config.kernels_at)
    assert isinstance(w, KernelWindow) and (w.rows, w.start, w.turns) == (8, 3, 5)
    for bad in ("32 60", "a b c"):
        with pytest.raises(ValueError, match="three integers"):
            from_env(EngineConfig(), {**env, "MLXD_KERNELS_AT": bad})
    config = from_env(EngineConfig(), {"MLXD_KERNELS": env["MLXD_KERNELS"]})
    w = KernelWindow.of(config.kernels, config.kernels_at)
    assert isinstance(w, KernelWindow) and (w.rows, w.start, w.turns) == (32, 60, 40)

    def no_torch() -> None:
        raise ModuleNotFoundError("No module named 'torch'")

    monkeypatch.setattr("mlxd.engine.kernel_window._cupti", no_torch)
    assert type(KernelWindow.of(config.kernels, config.kernels_at)) is NoWindow  # still serves


def _two_rows(engine) -> list[list[int]]:
    import mlx.core as mx

    from mlxd.engine.request import GenerationRequest

    first = engine.submit(GenerationRequest(prompt=mx.array([1, 2, 3, 4]), max_tokens=8))
    it = iter(first)
    head = [next(it).token]  # the lone row decodes serially (no batched rows) first
    second = engine.submit(GenerationRequest(prompt=mx.array(list(range(10, 30))), max_tokens=8))
    a = head + [e.token for e in it]
    b = [e.token for e in second]
    engine.close()
    return [a, b]


def _windowed(tiny_model, monkeypatch, tmp_path, order: str, **kw):
    """The two rows' tokens without the window, and an engine of `order` with a window over
    its 1st to 3rd turns of >= 2 rows (a stand-in profiler)."""
    from mlx_lm import load

    from mlxd.config import EngineConfig
    from mlxd.engine.engine import Engine

    model = load(str(tiny_model("qwen3")))[0]
    monkeypatch.delenv("MLXD_KERNELS", raising=False)
    plain = _two_rows(Engine(model, batch=4))
    monkeypatch.setattr("mlxd.engine.kernel_window._cupti", FakeProfiler)
    monkeypatch.setenv("MLXD_KERNELS", str(tmp_path / "k.txt"))
    monkeypatch.setenv("MLXD_KERNELS_AT", "2 1 3")
    config = EngineConfig(4, 4, 2048, step_order=order, **kw)
    return plain, Engine(model, batch=4, config=config)


def test_the_engine_reports_its_rows_and_times_its_steps(tiny_model, monkeypatch, tmp_path) -> None:
    plain, engine = _windowed(tiny_model, monkeypatch, tmp_path, "pipelined")
    window = engine.kernels
    assert isinstance(window, KernelWindow) and engine.rows.clock is window.clock
    seen: list[int] = []
    turn = window.turn
    window.turn = lambda rows: (seen.append(rows), turn(rows))  # type: ignore[method-assign]
    assert _two_rows(engine) == plain  # the timed step is the same step
    assert seen[0] == 0 and 2 in seen  # serial turns report 0; the two-row batch reports 2
    text = (tmp_path / "k.txt").read_text()
    assert "3 turns of >= 2 rows from the 1-th, step order pipelined" in text
    assert "host ms a step (3 steps): build " in text and ", encode " in text
    assert ", wait " in text


def test_step_clock_sums_parts_per_step(monkeypatch) -> None:
    from mlxd.engine import kernel_window

    now = iter([0.0, 0.001, 0.004, 1.0, 1.003, 1.004])
    monkeypatch.setattr(kernel_window.time, "perf_counter", lambda: next(now))
    c = kernel_window.StepClock()
    for _ in range(2):
        c.start()
        c.mark("build")
        c.mark("wait")
    assert c.line() == "host ms a step (2 steps): build 2.000, wait 2.000"
    c.reset()
    assert c.line() == "host ms a step (0 steps): no batched step"


def test_the_thread_orders_encoder_marks_its_own_parts(tiny_model, monkeypatch, tmp_path) -> None:
    """With `--step-order thread` the window's clock also holds the encoder's parts (`enc
    ...`, marked on its thread), and the tokens are those of the engine without the window."""
    plain, engine = _windowed(tiny_model, monkeypatch, tmp_path, "thread", thread_rows=1)
    assert _two_rows(engine) == plain
    text = (tmp_path / "k.txt").read_text()
    assert "step order thread" in text and "build " in text
    # marked before the tokens are handed over, so before the window's last turn ends
    assert "enc first " in text and "enc read " in text


def test_step_clock_keeps_each_threads_marks_apart(monkeypatch) -> None:
    """The encoder's thread marks between the engine's start and its next mark: each thread's
    part runs from its own last mark, and the turn's sum leaves the encoder's out."""
    import threading

    from mlxd.engine import kernel_window

    now = iter([0.0, 0.010, 0.012, 0.003])
    monkeypatch.setattr(kernel_window.time, "perf_counter", lambda: next(now))
    c = kernel_window.StepClock()
    c.start()  # the engine thread: 0.0

    def encoder() -> None:
        c.begin()  # 0.010
        c.mark("enc first")  # 0.012

    t = threading.Thread(target=encoder)
    t.start()
    t.join()
    c.mark("build")  # 0.003, from the engine thread's own 0.0
    assert c.line() == "host ms a step (1 steps): enc first 2.000, build 3.000"
    assert c.engine_ms() == pytest.approx(3.0)


def test_a_failing_window_closes_itself_and_never_raises_into_the_turn(tmp_path: Path) -> None:
    """The window runs inside the engine's turn, whose handler ends every running row: a
    profiler that fails to start, or a FILE that cannot be written, only closes the window."""
    w, prof = _window(tmp_path, start=1, turns=1)

    def broken() -> None:
        raise RuntimeError("CUPTI busy")

    prof.__enter__ = broken  # type: ignore[method-assign]
    w.turn(4)  # would open: fails, logged, closed
    assert w.done and prof.exited == 0
    w.turn(4)
    unwritable = KernelWindow(str(tmp_path / "no" / "k.txt"), 4, 1, 1, FakeProfiler())
    unwritable.turn(4)
    unwritable.turn(4)  # closes: the summary is read, FILE's folder does not exist
    assert unwritable.done
