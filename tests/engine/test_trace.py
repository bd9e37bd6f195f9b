"""MLXD_TRACE: a JSON line per engine turn, with the phases that ran and what they did."""

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxd.engine.arrivals import Arrivals
from mlxd.engine.engine import Engine
from mlxd.engine.instrument import NoTrace, Trace
from mlxd.engine.request import GenerationRequest


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))[0]


@pytest.fixture
def traced(model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(an engine with MLXD_TRACE set, the trace file); the engine is closed afterwards."""
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("MLXD_TRACE", str(path))
    engine = Engine(model, batch=4)
    yield engine, path
    engine.close()


def test_unset_is_a_no_op() -> None:
    from mlxd.config import EngineConfig, from_env

    assert from_env(EngineConfig(), {}).trace is None
    assert type(Trace.of(None)) is NoTrace


def test_a_line_per_turn_with_phases_paths_and_batch_counters(traced) -> None:
    engine, path = traced
    first = engine.submit(GenerationRequest(prompt=mx.array([1, 2, 3, 4]), max_tokens=6))
    next(iter(first))  # the lone row decodes serially before the second joins
    second = engine.submit(GenerationRequest(prompt=mx.array(list(range(10, 30))), max_tokens=6))
    first.wait(), second.wait()
    engine.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["t"] for x in lines] == sorted(x["t"] for x in lines)
    assert all("admit" in x and x["active"] >= 0 and x["waiting"] >= 0 for x in lines)
    paths: dict[str, int] = {}
    for x in lines:
        for k, v in x.get("paths", {}).items():
            paths[k] = paths.get(k, 0) + v
    assert paths == engine.paths  # every path taken shows up in the turn that took it
    assert any("serial" in x for x in lines) and any("batch" in x for x in lines)
    gen = [g for x in lines for g in x.get("gen", [])]
    # The second prompt's 20 tokens are prefilled by BatchGenerator (the last one in its first
    # step); the batch decodes until the first row ends, then the other drains to serial.
    assert sum(g["prompt_tokens"] for g in gen) == 19
    assert sum(g["decode_steps"] for g in gen) >= 2


def test_lines_are_kept_until_a_flush_point_not_written_per_turn(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    trace = Trace(str(path))
    for _ in range(3):
        trace.begin()
        trace.mark("admit")
        trace.end(lambda: [], 0, Counter())
    assert path.read_text() == ""  # no write (and no GIL release) per turn
    trace.idle()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 3 and all("admit" in x for x in lines)
    trace.FLUSH_S = 0.0  # a busy stretch is written out once FLUSH_S has passed
    trace.begin()
    trace.mark("admit")
    trace.end(lambda: [], 0, Counter())
    assert len(path.read_text().splitlines()) == 4
    trace.close()


def test_an_idle_engine_has_written_its_lines(traced) -> None:
    engine, path = traced
    engine.submit(GenerationRequest(prompt=mx.array([1, 2, 3]), max_tokens=4)).wait()
    deadline = time.monotonic() + 10
    while not path.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)  # the engine thread flushes once it waits for work (not closed yet)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines and all("t" in x for x in lines)


def _untraced_then_traced(
    make: Callable[[], Engine], rows: tuple[tuple[int, int], ...], tmp_path: Path, monkeypatch
) -> list[dict[str, Any]]:
    """Rows of (prompt length, max_tokens) through a fresh engine, untraced then traced: the
    same tokens both times (and every row its max_tokens); the trace's lines."""
    from bench.probes.trace_report import load

    def run() -> list[list[int]]:
        engine = make()
        reqs = [
            GenerationRequest(prompt=mx.array(list(range(3, 3 + n))), max_tokens=m) for n, m in rows
        ]
        out = [[e.token for e in h if hasattr(e, "token")] for h in engine.submit_many(reqs)]
        engine.close()
        return out

    monkeypatch.delenv("MLXD_TRACE", raising=False)
    plain = run()
    assert [len(t) for t in plain] == [m for _, m in rows]
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("MLXD_TRACE", str(path))
    assert run() == plain
    return load(str(path))


def test_a_join_has_its_parts_and_a_decode_turn_none(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows joining together (the buffer-keeping prefill CUDA runs): their turn's line says
    what the merge, the padded forward and the roll took and the padded shape; the turn moving
    them to decoding, its first step; a plain decode turn has no parts. Same tokens as untraced."""
    from bench.probes.trace_report import report
    from mlxd.config import EngineConfig
    from mlxd.engine import instrument

    def engine() -> Engine:
        return Engine(model, config=EngineConfig(4, 4, 2048, clear_cache=False))

    lines = _untraced_then_traced(engine, ((9, 5), (14, 5), (20, 5)), tmp_path, monkeypatch)
    assert instrument.start() is None  # the closed trace switched the timing off
    parts = [x["parts"] for x in lines if "parts" in x]
    wave = next(p for p in parts if "forward" in p)
    assert {"merge", "forward", "roll"} <= set(wave) and wave["shape"][:2] == [3, 19]
    assert any("first_step" in p for p in parts)
    decodes = [x for x in lines if any(g["decode_steps"] for g in x.get("gen", []))]
    assert any("parts" not in x for x in decodes)
    plain_steps = [x for x in decodes if not x["gen"][0]["prompt_tokens"]]
    assert plain_steps and all("forward" not in x.get("parts", {}) for x in plain_steps)
    assert any("parts: merge" in line and "shape 3x19x" in line for line in report(lines, 0.0))


def test_rows_leaving_have_their_parts(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of different lengths leave the batch on different steps: each such turn's line
    times the step queued before mlx-lm's filter, the filter's copies and the finished row's
    cache into the prefix store, and trace_report sums them. Same tokens as untraced."""
    from bench.probes.trace_report import report
    from mlxd.config import EngineConfig
    from mlxd.store import PrefixStore

    def engine() -> Engine:
        config = EngineConfig(4, 4, 2048, clear_cache=False)
        store = PrefixStore(max_entries=50)
        return Engine(model, config=config, prefix_store=store, namespace="tiny")

    lines = _untraced_then_traced(engine, ((9, 3), (14, 8), (20, 5)), tmp_path, monkeypatch)
    leaving = [x["parts"] for x in lines if "filter" in x.get("parts", {})]
    assert len(leaving) >= 2, leaving  # the first row, then the third, left before the last
    assert all({"leave_step", "filter", "finish"} <= set(p) for p in leaving[:2])
    plain_steps = [x for x in lines if x.get("gen") and x["gen"][0]["decode_steps"]]
    assert any("filter" not in x.get("parts", {}) for x in plain_steps)
    summary = [s for s in report(lines, 0.0) if s.startswith("rows leaving")]
    assert summary and "leave_step" in summary[0] and "finish" in summary[0]


def test_a_turn_that_admits_rows_has_their_arrival_and_queue_times(traced) -> None:
    engine, path = traced
    t0 = time.perf_counter()
    arrivals = Arrivals(0.0)  # a server's: each request's ticket stamps when it came
    with arrivals.coming() as ticket:
        time.sleep(0.02)  # the server builds the prompt before it submits
        handle = engine.submit(GenerationRequest(prompt=mx.array([1, 2, 3]), max_tokens=2), ticket)
    plain = engine.submit(GenerationRequest(prompt=mx.array([4, 5, 6]), max_tokens=2))
    handle.wait(), plain.wait()
    engine.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    joined = [x for x in lines if "queued" in x]
    assert sum(x.get("paths", {}).get("serial", 0) + x.get("paths", {}).get("batched", 0)
               for x in joined) == 2  # fmt: skip
    came = [x for x in joined if "came" in x]
    assert len(came) == 1  # only the request with a ticket has a server arrival
    first, last = came[0]["came"]
    assert first == last and came[0]["queued"][0] - first >= 0.02
    assert all(x["queued"][1] <= x["t"] for x in joined)  # queued before the turn began
    assert handle.arrived == ticket.came_at and t0 <= ticket.came_at <= handle.submitted
    assert plain.arrived is None
