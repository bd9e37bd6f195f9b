"""trace_report reads an MLXD_TRACE file: the eventful turns and the decode step by rows."""

import gzip
import json
from pathlib import Path

from bench.probes.trace_report import arrivals, cycles, decode_steps, events, load, report

TURNS = [
    {"t": 0.0, "admit": 0.3, "serial": 0.2, "active": 1, "waiting": 0, "paths": {"serial": 1}},
    {"t": 0.5, "admit": 0.0, "serial": 0.01, "active": 1, "waiting": 0},
    {"t": 0.6, "admit": 0.07, "batch": 0.4, "active": 4, "waiting": 0,
     "gen": [{"fmt": "None", "rows": 4, "prompt_tokens": 200, "prompt_s": 0.3,
              "decode_steps": 0, "decode_s": 0.0}], "paths": {"batched": 3}},
    {"t": 1.0, "admit": 0.0, "batch": 0.02, "active": 4, "waiting": 0,
     "gen": [{"fmt": "None", "rows": 4, "prompt_tokens": 0, "prompt_s": 0.0,
              "decode_steps": 1, "decode_s": 0.020}]},
    {"t": 1.02, "admit": 0.0, "batch": 0.03, "active": 4, "waiting": 0,
     "gen": [{"fmt": "None", "rows": 4, "prompt_tokens": 0, "prompt_s": 0.0,
              "decode_steps": 1, "decode_s": 0.030}]},
    {"t": 1.05, "admit": 0.0, "batch": 0.2, "active": 2, "waiting": 0,
     "gen": [{"fmt": "None", "rows": 2, "prompt_tokens": 0, "prompt_s": 0.0,
              "decode_steps": 1, "decode_s": 0.19}]},
    {"t": 2.0, "admit": 0.9, "active": 0, "waiting": 0},  # idle: not an event
]  # fmt: skip


def test_events_are_joins_prefills_and_stalls_not_idle_waits() -> None:
    assert [x["t"] for x in events(TURNS, stall=0.05)] == [0.0, 0.6, 1.05]


def test_decode_steps_by_rows_leave_out_prefill_turns() -> None:
    assert decode_steps(TURNS) == {4: [0.020, 0.030], 2: [0.19]}


def test_cycles_run_from_a_decode_turn_to_the_next_turn() -> None:
    got = cycles(TURNS)
    assert list(got) == [4, 2]
    assert [round(c, 6) for c in got[4]] == [0.02, 0.03] and [round(c, 6) for c in got[2]] == [0.95]


def test_report_reads_plain_and_gzipped_files(tmp_path: Path) -> None:
    text = "".join(json.dumps(x) + "\n" for x in TURNS)
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text(text)
    with gzip.open(packed, "wt") as f:
        f.write(text)
    assert load(str(plain)) == load(str(packed)) == TURNS
    lines = report(TURNS, 0.05)
    assert lines[0].startswith("7 turns") and "    4 rows:   25.00 ms (2) |   25.00" in lines


def test_a_joins_requests_are_shown_relative_to_its_turn() -> None:
    join = {"t": 3.0, "came": [2.8, 2.85], "queued": [2.83, 2.9995]}
    assert arrivals(join) == "\n           requests: came -200.0..-150.0 ms, queued -170.0..-0.5 ms"
    assert arrivals({"t": 3.0, "queued": [2.9, 2.95]}).endswith("queued -100.0..-50.0 ms")
    assert arrivals(TURNS[2]) == ""  # a trace without arrival times has neither
