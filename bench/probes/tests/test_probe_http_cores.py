"""Two host-side probes end to end on the CPU: probe_http (mlxd's real server on a paced
stand-in engine, raw-socket streams) and probe_cores (the step timed on each CPU in turn)."""

import json
import re
from collections.abc import Callable
from pathlib import Path

from bench.probes import probe_cores, probe_http


def test_probe_http_streams_every_frame_and_reports_the_engines_steps(
    tiny_model: Callable[..., Path], capsys
) -> None:
    argv = ["--model", str(tiny_model("qwen3")), "--streams", "3", "--tokens", "12"]
    probe_http.main([*argv, "--step-ms", "20", "--gil-ms", "2"])
    out = json.loads(capsys.readouterr().out)
    # A stream's frames: the role chunk, one per token (the last carries finish_reason), usage.
    assert out["streams"] == 3 and out["frames"] == 3 * (1 + 12 + 1)
    assert out["loop_cpu_us_per_frame"] > 0 and 0 < out["loop_busy"] < 1
    # The paced engine never steps faster than it was paced, and keeps pace on an idle machine.
    assert 20 <= out["step_p50_ms"] < 60 and out["step_mean_ms"] >= 20


def test_probe_http_work_mode_with_the_engines_phases_and_held_wake(
    tiny_model: Callable[..., Path], capsys
) -> None:
    """--work --engine-phases --rest-ms: every frame still arrives with the readers' wake-ups
    held to the next step, and each build is timed."""
    argv = ["--model", str(tiny_model("qwen3")), "--streams", "3", "--tokens", "12"]
    argv += ["--step-ms", "20", "--gil-ms", "2", "--work", "--engine-phases", "--rest-ms", "1"]
    probe_http.main(argv)
    out = json.loads(capsys.readouterr().out)
    assert out["frames"] == 3 * (1 + 12 + 1)
    # the device part is fixed (18 ms) and the build as long as 2 ms alone, or longer
    assert 2 <= out["build_p50_ms"] < 20 and out["step_mean_ms"] >= 20


def test_paced_engine_holds_the_wake_until_its_next_build(monkeypatch) -> None:
    """The paced engine's readers are woken inside its next build's queue point (waiting()),
    the last step's at once."""
    from bench.probes import paced_engine
    from mlxd.engine import overlap
    from mlxd.engine.overlap import StepPhases
    from mlxd.engine.request import GenerationRequest

    phase = ["idle"]
    seen: list[str] = []
    real = overlap.wake
    monkeypatch.setattr(overlap, "wake", lambda w: (seen.append(phase[0]), real(w)))
    monkeypatch.setattr(paced_engine, "wake", lambda w: (seen.append("at once"), real(w)))
    build = paced_engine.PacedEngine._build

    def tagged(self, start: float) -> None:
        phase[0] = "build"
        try:
            build(self, start)
        finally:
            phase[0] = "idle"

    monkeypatch.setattr(paced_engine.PacedEngine, "_build", tagged)
    phases = StepPhases(0.005)
    engine = paced_engine.PacedEngine([(1, "a")], 0.004, 0.001, work=True, phases=phases)
    import asyncio

    import mlx.core as mx

    async def read() -> int:
        handle = engine.submit(GenerationRequest(prompt=mx.array([1, 2]), max_tokens=4))
        return len([e async for e in handle])

    try:
        assert asyncio.run(read()) == 4
    finally:
        engine.close()
    assert seen == ["build"] * 3 + ["at once"]  # steps 1-3 held to the next build; 4 at once


def test_probe_cores_times_each_row_count_on_each_cpu_in_every_pass(capsys) -> None:
    probe_cores.main(["--shape", "qwen3-host", "--rows", "1", "2", "--context", "32",
                      "--steps", "2", "--passes", "2"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    cpus = [int(c) for c in re.search(r"CPUs \[([\d, ]+)\]", lines[0]).group(1).split(",")]
    for rows in (1, 2):
        start = lines.index(f"{rows} rows: median ms per CPU (pass by pass)")
        per_cpu = lines[start + 1 : start + 1 + len(cpus)]
        assert [int(re.match(r" +cpu +(\d+):", s).group(1)) for s in per_cpu] == cpus
        assert all(len(re.findall(r"[\d.]+", s.split(":")[1])) == 2 for s in per_cpu)
        assert re.match(r" +fastest CPU [\d.]+ ms, slowest [\d.]+ ms", lines[start + 1 + len(cpus)])
