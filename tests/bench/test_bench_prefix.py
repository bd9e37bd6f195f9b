"""`mlxd bench prefix` end to end on the tiny qwen3 model (real mlxd servers as subprocesses on
free ports), and its per-round ratios on hand-made numbers. Nothing here asserts a speed: only
what the store must report (cached tokens) and that the numbers land where the tables read them."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxd.bench.prefix_report import markdown, summarize
from mlxd.cli import main

PREFIX, MAX_TOKENS = 512, 4
FEW = 8  # template tokens around the system prompt that a lookup may or may not include


def test_bench_prefix_tiny_all_sections(tmp_path: Path, tiny_model: Callable[..., Path]) -> None:
    out, md = tmp_path / "prefix.json", tmp_path / "prefix.md"
    argv = ["bench", "prefix", "--model", str(tiny_model("qwen3")), "--prefix-tokens", str(PREFIX)]
    argv += ["--rounds", "1", "--agents", "2", "--turns", "2", "--max-tokens", str(MAX_TOKENS)]
    argv += ["--json", str(out), "--markdown", str(md), "--log-dir", str(tmp_path / "logs")]
    main(argv)  # returns normally: no failed request
    result = json.loads(out.read_text())
    assert list(result["sections"]) == ["agents", "restart", "fleet"]
    assert result["summary"]["errors"] == 0

    # 1. A misses (its system prompt is new), B reuses A's system prompt.
    (rnd,) = result["sections"]["agents"]["rounds"]
    a, b = rnd["a"], rnd["b"]
    assert a["prompt_tokens"] > PREFIX and b["prompt_tokens"] > PREFIX
    assert a["cached_tokens"] < FEW
    assert PREFIX - FEW <= b["cached_tokens"] < b["prompt_tokens"]
    assert a["completion_tokens"] == b["completion_tokens"] == MAX_TOKENS
    s = result["summary"]["agents"]
    assert s["cold_over_warm"]["median"] == pytest.approx(a["ttft_s"] / b["ttft_s"])

    # 2. Server 1 exits cleanly on SIGINT with its entries on disk; server 2 serves the same
    # prompt from them; the server without a disk tier prefills it all.
    (rnd,) = result["sections"]["restart"]["rounds"]
    assert rnd["stop"]["signal"] == "SIGINT" and rnd["stop"]["exit_code"] == 0
    assert not rnd["stop"]["killed_after_timeout"] and rnd["disk_after_stop"]["files"] > 0
    first, restored, plain = rnd["first"], rnd["restored"], rnd["reprefill"]
    assert first["prompt_tokens"] == restored["prompt_tokens"] == plain["prompt_tokens"]
    assert restored["cached_tokens"] >= restored["prompt_tokens"] - 1
    assert first["cached_tokens"] < FEW and plain["cached_tokens"] < FEW
    assert result["summary"]["restart"]["reprefill_over_restored"]["median"] > 0

    # 3. The same fleet twice: the store on serves cached tokens, off none.
    fleet = result["sections"]["fleet"]
    (on,), (off,) = fleet["on"]["runs"]["2"], fleet["off"]["runs"]["2"]
    assert "--prompt-cache-size" in fleet["off"]["command"]
    assert "--prompt-cache-size" not in fleet["on"]["command"]
    assert on["figures"]["requests"] == off["figures"]["requests"] == 2 * 2
    assert on["figures"]["errors"] == off["figures"]["errors"] == 0
    assert off["figures"]["cached_tokens"] == 0 and on["figures"]["cached_tokens"] > PREFIX
    per = result["summary"]["fleet"]["2"]
    assert per["on"]["cached_tokens"] > 0 and per["off"]["cached_tokens"] == 0
    assert per["ratio"]["ttft_p50_s"] > 0

    table = md.read_text()
    for head in ("## 1.", "## 2.", "## 3.", "| 2 | on/off |"):
        assert head in table


def _rec(ttft: float | None, cached: int, prompt: int = 100) -> dict:
    error = None if ttft is not None else "HTTP 500"
    return {"ttft_s": ttft, "cached_tokens": cached, "prompt_tokens": prompt, "error": error}


def test_ratios_are_taken_per_round_and_skip_failed_requests() -> None:
    agents = {
        "rounds": [
            {"a": _rec(2.0, 0), "b": _rec(0.5, 90)},  # 4.0
            {"a": _rec(3.0, 0), "b": _rec(0.3, 90)},  # 10.0
            {"a": _rec(1.0, 0), "b": _rec(0.5, 90)},  # 2.0
            {"a": _rec(9.0, 0), "b": _rec(None, 0)},  # failed: no ratio
        ]
    }
    stop = {"exit_code": 0, "killed_after_timeout": False}
    rnd = {"first": _rec(1.0, 0), "restored": _rec(0.2, 99), "reprefill": _rec(1.2, 0)}
    restart = {"rounds": [rnd | {"stop": stop}]}
    args = {"prefix_tokens": 90, "rounds": 4, "max_tokens": 4, "agents": [2]}
    env = {"device": "cpu", "cpu_count": 2, "mlx": "x", "mlx_lm": "y", "mlxd": "z"}
    result = {"sections": {"agents": agents, "restart": restart}, "args": args, "env": env}
    s = summarize(result)
    assert s["errors"] == 1
    ratio = s["agents"]["cold_over_warm"]
    assert ratio["values"] == pytest.approx([4.0, 10.0, 2.0]) and ratio["median"] == 4.0
    assert s["agents"]["a_ttft_s"]["median"] == 2.5  # medians of the four A requests
    assert s["restart"]["reprefill_over_restored"]["median"] == pytest.approx(6.0)
    assert s["restart"]["restored_cached"]["median"] == 99
    result |= {"summary": s, "command": "mlxd bench prefix", "model": {"name": "m"}}
    table = markdown(result)
    assert "4.00 [2.00-10.00]" in table and "6.00" in table and "## 3." not in table


@pytest.mark.parametrize("sections", ["", "agents,nope"])
def test_bench_prefix_refuses_unknown_sections(sections: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "prefix", "--sections", sections])
    assert e.value.code not in (0, None)
